//! Record batches (placeholder).
use bytes::Bytes;

pub(crate) struct HeaderIter;
impl HeaderIter {
    pub(crate) fn new(_b: Bytes, _n: u32) -> Self { Self }
}
impl Iterator for HeaderIter {
    type Item = (Bytes, Option<Bytes>);
    fn next(&mut self) -> Option<Self::Item> { None }
}
