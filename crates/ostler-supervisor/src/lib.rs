//! ostler-supervisor
