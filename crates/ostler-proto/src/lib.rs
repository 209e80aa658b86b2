//! ostler-proto
