//! ostler-engine
