//! ostler-store
