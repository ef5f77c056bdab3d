//! Consumer configuration (placeholder).
/// Config.
#[derive(Debug, Clone, Default)]
pub struct ConsumerConfig;
/// Builder.
#[derive(Debug, Clone, Default)]
pub struct ConsumerConfigBuilder;
/// Isolation.
#[derive(Debug, Clone, Copy, Default)]
pub enum IsolationLevel { /// u
 #[default] ReadUncommitted }
/// Reset.
#[derive(Debug, Clone, Copy, Default)]
pub enum OffsetReset { /// e
 #[default] Error }
