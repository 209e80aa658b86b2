//! How a CLI process ended: the exit facts the operating system reports, defined once.
//!
//! The supervisor's exit report, the store's exit columns and the engine's stored
//! `process_exited` event each nest (or flatten) an [`ExitFacts`] and add their own fields.

use serde::{Deserialize, Serialize};

/// What the operating system says of an ended process. Serialized flat (`code`, `signal`,
/// each left out when absent), as every stored `process_exited` event has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExitFacts {
    /// Exit code, when it exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that ended it (e.g. 9 for `kill -9`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl ExitFacts {
    /// A clean exit: code 0 and no signal.
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_code_zero_without_signal() {
        assert!(
            ExitFacts {
                code: Some(0),
                signal: None
            }
            .success()
        );
        assert!(
            !ExitFacts {
                code: Some(1),
                signal: None
            }
            .success()
        );
        assert!(
            !ExitFacts {
                code: None,
                signal: Some(9)
            }
            .success()
        );
        assert!(!ExitFacts::default().success());
    }

    #[test]
    fn absent_facts_are_left_out() {
        let json = serde_json::to_string(&ExitFacts {
            code: None,
            signal: Some(15),
        })
        .expect("json");
        assert_eq!(json, r#"{"signal":15}"#);
        let back: ExitFacts = serde_json::from_str(&json).expect("decode");
        assert_eq!(back.signal, Some(15));
        assert_eq!(back.code, None);
    }
}
