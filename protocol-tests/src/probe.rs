//! A raw Metadata v4 request, used to tell when a broker is serving and which brokers it knows.
//! Hand-encoded so that readiness polling needs no JVM.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// One broker as listed in a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerInfo {
    pub(crate) node_id: i32,
    pub(crate) host: String,
    pub(crate) port: i32,
}

/// One partition as listed in a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionMeta {
    pub(crate) partition: i32,
    pub(crate) error_code: i16,
    pub(crate) leader: i32,
}

/// One topic as listed in a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicMeta {
    pub(crate) name: String,
    pub(crate) error_code: i16,
    pub(crate) partitions: Vec<PartitionMeta>,
}

/// The parts of a Metadata response the harness uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metadata {
    pub(crate) brokers: Vec<BrokerInfo>,
    pub(crate) topics: Vec<TopicMeta>,
}

/// Sends Metadata v4 (no topics) to `addr` and returns the brokers of the answer.
pub(crate) fn metadata_brokers(addr: &str, timeout: Duration) -> io::Result<Vec<BrokerInfo>> {
    metadata(addr, &[], timeout).map(|m| m.brokers)
}

/// Sends Metadata v4 for `topics` (never auto-creating them) to `addr`.
pub(crate) fn metadata(addr: &str, topics: &[&str], timeout: Duration) -> io::Result<Metadata> {
    let sock: SocketAddr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
    let mut stream = TcpStream::connect_timeout(&sock, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;

    let client_id = b"protocol-tests-probe";
    let correlation_id: i32 = 0x7072_6f62;
    let mut body = Vec::new();
    body.extend_from_slice(&3i16.to_be_bytes()); // api key: Metadata
    body.extend_from_slice(&4i16.to_be_bytes()); // api version 4
    body.extend_from_slice(&correlation_id.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    // topics: an empty array asks for none (null would mean all)
    body.extend_from_slice(&(topics.len() as i32).to_be_bytes());
    for t in topics {
        body.extend_from_slice(&(t.len() as i16).to_be_bytes());
        body.extend_from_slice(t.as_bytes());
    }
    body.push(0); // allow_auto_topic_creation = false
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if !(8..=64 * 1024 * 1024).contains(&len) {
        return Err(bad(format!("response size {len}")));
    }
    let mut buf = vec![0u8; len as usize];
    stream.read_exact(&mut buf)?;
    let mut r = Reader { buf: &buf, pos: 0 };
    let got = r.i32()?;
    if got != correlation_id {
        return Err(bad(format!("correlation id {got}")));
    }
    let _throttle_time_ms = r.i32()?;
    let mut brokers = Vec::new();
    for _ in 0..r.count()? {
        let node_id = r.i32()?;
        let host = r.string()?.unwrap_or_default();
        let port = r.i32()?;
        let _rack = r.string()?;
        brokers.push(BrokerInfo {
            node_id,
            host,
            port,
        });
    }
    let _cluster_id = r.string()?;
    let _controller_id = r.i32()?;
    let mut topics = Vec::new();
    for _ in 0..r.count()? {
        let error_code = r.i16()?;
        let name = r.string()?.unwrap_or_default();
        let _is_internal = r.take(1)?;
        let mut partitions = Vec::new();
        for _ in 0..r.count()? {
            let error_code = r.i16()?;
            let partition = r.i32()?;
            let leader = r.i32()?;
            for _ in 0..r.count()? {
                r.i32()?; // replica
            }
            for _ in 0..r.count()? {
                r.i32()?; // isr
            }
            partitions.push(PartitionMeta {
                partition,
                error_code,
                leader,
            });
        }
        topics.push(TopicMeta {
            name,
            error_code,
            partitions,
        });
    }
    Ok(Metadata { brokers, topics })
}

fn bad(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad Metadata response: {what}"),
    )
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| bad("truncated".into()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn i16(&mut self) -> io::Result<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    /// An array length; null (-1) counts as empty.
    fn count(&mut self) -> io::Result<usize> {
        let n = self.i32()?;
        if n > 1_000_000 {
            return Err(bad(format!("array length {n}")));
        }
        Ok(n.max(0) as usize)
    }

    fn i32(&mut self) -> io::Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> io::Result<Option<String>> {
        let b = self.take(2)?;
        let len = i16::from_be_bytes([b[0], b[1]]);
        if len < 0 {
            return Ok(None);
        }
        let s = self.take(len as usize)?;
        Ok(Some(String::from_utf8_lossy(s).into_owned()))
    }
}
