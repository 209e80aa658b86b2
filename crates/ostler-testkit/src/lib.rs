//! ostler-testkit
