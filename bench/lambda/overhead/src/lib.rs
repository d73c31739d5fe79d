//! Nothing here: the measurements are `benches/overhead.rs`.
