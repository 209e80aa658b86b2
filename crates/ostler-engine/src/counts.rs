//! Sessions per stored state, kept in memory for health: counted once at start, then moved
//! by every write of a session's state (create, state change, delete). Health reads it
//! instead of listing the store, so its cost does not grow with the stored sessions.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::types::SessionState;

#[derive(Debug, Default)]
pub(crate) struct StateCounts(Mutex<BTreeMap<SessionState, u64>>);

impl StateCounts {
    /// A session's stored state went from `from` (`None`: it was created) to `to`
    /// (`None`: it was deleted).
    pub fn moved(&self, from: Option<SessionState>, to: Option<SessionState>) {
        if from == to {
            return;
        }
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = from
            && let Some(n) = m.get_mut(&f)
        {
            *n = n.saturating_sub(1);
        }
        if let Some(t) = to {
            *m.entry(t).or_default() += 1;
        }
    }

    /// Every state with its count (zero included).
    pub fn snapshot(&self) -> BTreeMap<SessionState, u64> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        SessionState::ALL
            .iter()
            .map(|s| (*s, m.get(s).copied().unwrap_or(0)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_keep_every_state_and_never_go_negative() {
        let c = StateCounts::default();
        c.moved(None, Some(SessionState::Starting));
        c.moved(Some(SessionState::Starting), Some(SessionState::Idle));
        c.moved(None, Some(SessionState::Starting));
        c.moved(Some(SessionState::Idle), None);
        c.moved(Some(SessionState::Stopped), None);
        let s = c.snapshot();
        assert_eq!(s.len(), SessionState::ALL.len());
        assert_eq!(s[&SessionState::Starting], 1);
        assert_eq!(s[&SessionState::Idle], 0);
        assert_eq!(s[&SessionState::Stopped], 0);
    }
}
