//! A blocking facade for thread-per-operator engines.
//!
//! [`Consumer`] owns a small Tokio runtime (one worker thread) that runs the network loop;
//! fetched data waits in a queue bounded by `buffer.max.bytes`, and
//! [`poll`](Consumer::poll) decodes and hands it out on the caller's thread.

use std::time::Duration;

use crate::config::ConsumerConfig;
use crate::error::{Error, Result};
use crate::types::{Batch, StartPosition, TopicPartition};

/// A consumer whose methods block the calling thread. See the [module docs](self).
#[derive(Debug)]
pub struct Consumer {
    inner: Option<crate::Consumer>,
    runtime: tokio::runtime::Runtime,
}

impl Consumer {
    /// Starts the consumer's runtime and network loop.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the runtime's thread cannot be started.
    pub fn new(config: ConsumerConfig) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kafka-source-net")
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                broker: crate::BrokerRef::Address("runtime".into()),
                source,
            })?;
        let inner = runtime.block_on(async { crate::Consumer::new(config) })?;
        Ok(Self {
            inner: Some(inner),
            runtime,
        })
    }

    fn inner(&mut self) -> Result<&mut crate::Consumer> {
        self.inner.as_mut().ok_or(Error::Closed)
    }

    /// See [`crate::Consumer::assign`].
    pub fn assign(
        &mut self,
        partitions: impl IntoIterator<Item = (TopicPartition, StartPosition)>,
    ) {
        if let Ok(c) = self.inner() {
            c.assign(partitions);
        }
    }

    /// See [`crate::Consumer::subscribe`]. Heartbeats run on this consumer's own runtime,
    /// between calls to [`poll`](Self::poll) too.
    ///
    /// # Errors
    ///
    /// As [`crate::Consumer::subscribe`].
    pub fn subscribe<T: Into<String>>(
        &mut self,
        topics: impl IntoIterator<Item = T>,
    ) -> Result<()> {
        self.inner()?.subscribe(topics)
    }

    /// See [`crate::Consumer::subscribe_pattern`].
    ///
    /// # Errors
    ///
    /// As [`crate::Consumer::subscribe_pattern`].
    pub fn subscribe_pattern(&mut self, pattern: &str) -> Result<()> {
        self.inner()?.subscribe_pattern(pattern)
    }

    /// See [`crate::Consumer::set_rebalance_listener`]; the listener runs inside
    /// [`poll`](Self::poll).
    pub fn set_rebalance_listener(&mut self, listener: impl crate::RebalanceListener + 'static) {
        if let Ok(c) = self.inner() {
            c.set_rebalance_listener(listener);
        }
    }

    /// See [`crate::Consumer::seek`].
    ///
    /// # Errors
    ///
    /// As [`crate::Consumer::seek`].
    pub fn seek(&mut self, tp: &TopicPartition, start: StartPosition) -> Result<()> {
        self.inner()?.seek(tp, start)
    }

    /// See [`crate::Consumer::pause`].
    pub fn pause(&mut self, partitions: &[TopicPartition]) {
        if let Ok(c) = self.inner() {
            c.pause(partitions);
        }
    }

    /// See [`crate::Consumer::resume`].
    pub fn resume(&mut self, partitions: &[TopicPartition]) {
        if let Ok(c) = self.inner() {
            c.resume(partitions);
        }
    }

    /// See [`crate::Consumer::assignment`].
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.inner
            .as_ref()
            .map(|c| c.assignment())
            .unwrap_or_default()
    }

    /// See [`crate::Consumer::position`]; blocks up to `timeout`.
    ///
    /// # Errors
    ///
    /// As [`crate::Consumer::position`], or [`Error::Timeout`].
    pub fn position(&mut self, tp: &TopicPartition, timeout: Duration) -> Result<i64> {
        let Self { inner, runtime } = self;
        let inner = inner.as_mut().ok_or(Error::Closed)?;
        runtime.block_on(async {
            tokio::time::timeout(timeout, inner.position(tp))
                .await
                .map_err(|_| Error::timeout(format!("position of {tp}"), timeout))?
        })
    }

    /// The next batch, waiting up to `timeout`; `Ok(None)` when nothing arrived in time.
    ///
    /// # Errors
    ///
    /// As [`crate::Consumer::poll`].
    pub fn poll(&mut self, timeout: Duration) -> Result<Option<Batch>> {
        let Self { inner, runtime } = self;
        let inner = inner.as_mut().ok_or(Error::Closed)?;
        runtime.block_on(async {
            match tokio::time::timeout(timeout, inner.poll()).await {
                Ok(r) => r.map(Some),
                Err(_) => Ok(None),
            }
        })
    }

    /// Stops the network loop and the runtime.
    pub fn close(mut self) {
        if let Some(inner) = self.inner.take() {
            self.runtime.block_on(inner.close());
        }
    }
}
