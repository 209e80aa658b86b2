//! Which messages written to the CLI are still owed an answer.
//!
//! The CLI answers the messages it is sent in order, but 2.1.x may answer several that
//! queued up together in one turn, so results cannot be counted against sends. 2.1.330 and
//! later name the messages a result answered (`user_message_uuids`) and say when a queued
//! one is withdrawn (`command_lifecycle` `cancelled`) or done with (`completed`, which ends
//! a message no result named); with them the session knows what is still to come. From
//! releases that name nothing, a result ends whatever ran.

use std::collections::VecDeque;

/// The messages a live session's CLI process still owes an answer, in the order sent.
#[derive(Debug, Default)]
pub(super) struct Owed {
    unanswered: VecDeque<String>,
    /// Whether this process's results name the messages they answered.
    names_answers: bool,
}

impl Owed {
    /// A message (its wire id) was handed to the CLI.
    pub(super) fn sent(&mut self, message_id: &str) {
        self.unanswered.push_back(message_id.to_owned());
    }

    /// A message's write failed (or it was withdrawn before the CLI answered it): whether
    /// it was still owed.
    pub(super) fn withdrawn(&mut self, message_id: &str) -> bool {
        let before = self.unanswered.len();
        self.unanswered.retain(|m| m != message_id);
        self.unanswered.len() != before
    }

    /// A result naming the messages it answered (`ids`) came: the turns still owed after
    /// it. The messages it names and every one sent before the last of them are answered
    /// (the CLI takes them in order); those sent after are still owed. A result that names
    /// none is a turn of the CLI's own when this process's results name their messages
    /// (the queued ones are still owed); otherwise it ends whatever ran: 0.
    pub(super) fn answered(&mut self, ids: &[String]) -> u32 {
        if ids.is_empty() {
            if !self.names_answers {
                self.unanswered.clear();
            }
        } else {
            self.names_answers = true;
            if let Some(last) = self.unanswered.iter().rposition(|m| ids.contains(m)) {
                self.unanswered.drain(..=last);
            }
        }
        u32::try_from(self.unanswered.len()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn sent(v: &[&str]) -> Owed {
        let mut o = Owed::default();
        for m in v {
            o.sent(m);
        }
        o
    }

    #[test]
    fn a_release_that_names_nothing_ends_everything_at_a_result() {
        let mut o = sent(&["a", "b"]);
        assert_eq!(o.answered(&[]), 0);
        o.sent("c");
        assert_eq!(o.answered(&[]), 0);
    }

    #[test]
    fn named_messages_and_those_before_them_are_answered_the_rest_are_owed() {
        let mut o = sent(&["a", "b", "c"]);
        assert_eq!(o.answered(&ids(&["a"])), 2);
        // b and c merged into one turn.
        assert_eq!(o.answered(&ids(&["b", "c"])), 0);

        // A result naming only the last of a merged batch answers the earlier ones too.
        let mut o = sent(&["a", "b", "c", "d"]);
        assert_eq!(o.answered(&ids(&["c"])), 1);
        assert_eq!(o.answered(&ids(&["d"])), 0);
    }

    #[test]
    fn a_turn_of_the_clis_own_leaves_the_queued_messages_owed() {
        let mut o = sent(&["a", "b"]);
        assert_eq!(o.answered(&ids(&["a"])), 1);
        // A scheduled turn (no ids) or one naming an id ostler never sent.
        assert_eq!(o.answered(&[]), 1);
        assert_eq!(o.answered(&ids(&["cron-1"])), 1);
        assert_eq!(o.answered(&ids(&["b"])), 0);
    }

    #[test]
    fn a_withdrawn_message_is_no_longer_owed() {
        let mut o = sent(&["a", "b", "c"]);
        assert!(o.withdrawn("b"));
        assert!(!o.withdrawn("b"), "only once");
        assert!(!o.withdrawn("zz"));
        assert_eq!(o.answered(&ids(&["a"])), 1);
        assert!(o.withdrawn("c"));
        assert_eq!(o.answered(&[]), 0);
    }
}
