//! Which messages written to the CLI are still owed an answer.
//!
//! The CLI answers the messages it is sent in order, but 2.1.x may answer several that
//! queued up together in one turn, so results cannot be counted against sends. 2.1.330 and
//! later name the messages a result answered (`user_message_uuids`) and say when a queued
//! one is withdrawn (`command_lifecycle` `cancelled`) or done with (`completed`, which ends
//! a message no result named); with them the session knows what is still to come. From
//! releases that name nothing (from 1.0.108 on), the CLI's echo of each message it takes
//! into a turn (`--replay-user-messages`) says which messages a result answered. A result
//! with no echo before it, from a process that echoes, answered one message the CLI runs
//! without a turn (a slash command: 1.0.108-2.1.121 answer each queued one with a result
//! of its own and echo none), the oldest owed. From a process that never echoed (1.0.59,
//! or before its first echo), a result ends whatever ran.
//!
//! After a result, an echo or the lifecycle `started` of a message owed shows the CLI took
//! it (the actor's `queue_grace` waits for one of them, or a turn's output).
//!
//! It is also the session's count of turns still to come (what keeps it RUNNING): the
//! messages owed, plus a turn the CLI runs that no message is owed for (its output came
//! with none owed: a turn of its own, or the answer to a message whose echo it never sent).

use std::collections::VecDeque;

use ostler_protocol::outbound::Priority;

/// How many of the last ids written are remembered to know their echoes by.
const RECENT: usize = 64;

/// The messages a live session's CLI process still owes an answer, in the order sent.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// With the priority each was sent with (`next` when none was asked for).
    unanswered: VecDeque<(String, Priority)>,
    /// Whether this process's results name the messages they answered.
    names_answers: bool,
    /// The messages the CLI echoed (`--replay-user-messages`: it took them into a turn)
    /// since its last result.
    taken: Vec<String>,
    /// The last ids written, to know an echo by (1.0.x does not mark it `isReplay`).
    recent: VecDeque<String>,
    /// A turn's output came while no message was owed: the CLI runs a turn of its own
    /// until its result.
    unowed_turn: bool,
    /// This process echoes the messages it takes into a turn (one was seen).
    echoes: bool,
    /// The CLI said it started on a message owed (lifecycle `started`, 2.1.330 and later)
    /// since its last result.
    started: bool,
}

impl Owed {
    /// The turns still to come: the messages owed, and a turn of the CLI's own.
    pub(super) fn turns(&self) -> u32 {
        u32::try_from(self.unanswered.len())
            .unwrap_or(u32::MAX)
            .saturating_add(u32::from(self.unowed_turn))
    }

    /// A turn's output (not a result) came from the CLI: with nothing owed, it runs a turn
    /// no message asked for.
    pub(super) fn output(&mut self) {
        if self.unanswered.is_empty() {
            self.unowed_turn = true;
        }
    }

    /// A message (its wire id) was handed to the CLI, with the priority it asked for.
    pub(super) fn sent(&mut self, message_id: &str, priority: Option<Priority>) {
        self.unanswered
            .push_back((message_id.to_owned(), priority.unwrap_or(Priority::Next)));
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(message_id.to_owned());
    }

    /// A user frame with this `uuid` came from the CLI: whether it is the echo of a message
    /// written to it (then the CLI took that message into the turn running now). Not every
    /// frame marked `isReplay` is one: the output of a local command (`set_model`) is
    /// marked too, with an id of the CLI's own.
    pub(super) fn echoed(&mut self, uuid: &str) -> bool {
        if !self.recent.iter().any(|m| m == uuid) {
            return false;
        }
        self.echoes = true;
        if !self.taken.iter().any(|m| m == uuid) {
            self.taken.push(uuid.to_owned());
        }
        true
    }

    /// The CLI says it started on `message_id` (lifecycle `started`): if that is owed, the
    /// CLI took it, as its echo (which may come much later: after the message's
    /// UserPromptSubmit hooks) would show.
    pub(super) fn started(&mut self, message_id: &str) {
        if self.unanswered.iter().any(|(m, _)| m == message_id) {
            self.started = true;
        }
    }

    /// Whether the CLI took a message into a turn since its last result (it echoed it or
    /// said it started on it).
    pub(super) fn taken_since_result(&self) -> bool {
        !self.taken.is_empty() || self.started
    }

    /// Forgets every message owed (and a turn of the CLI's own): none is coming. Returns
    /// how many messages were owed.
    pub(super) fn forget(&mut self) -> usize {
        self.unowed_turn = false;
        let n = self.unanswered.len();
        self.unanswered.clear();
        n
    }

    /// A message's write failed (or it was withdrawn before the CLI answered it): whether
    /// it was still owed.
    pub(super) fn withdrawn(&mut self, message_id: &str) -> bool {
        let before = self.unanswered.len();
        self.unanswered.retain(|(m, _)| m != message_id);
        self.unanswered.len() != before
    }

    /// A result came, naming the messages it answered (`named`, maybe none). It ends any
    /// turn of the CLI's own.
    /// - It names some: those are answered, and so is every one sent before the last of
    ///   them that kept the queue's order (not `now`, which jumps the queue and says
    ///   nothing of those before it), except a `later` one before a `next` one (deferred
    ///   behind it); those sent after are still owed.
    /// - It names none, from a process whose results name their messages: a turn of the
    ///   CLI's own (the queued ones are still owed).
    /// - It names none, from a release that names nothing, after echoes: it answered the
    ///   echoed messages (and those before them). They are returned, to be named in the
    ///   result.
    /// - It names none and nothing was echoed before it, from a process that echoes: it
    ///   answered the oldest message owed (one the CLI ran without a turn, a slash
    ///   command), returned to be named.
    /// - Otherwise nothing says what it answered: it ends whatever ran (nothing owed).
    pub(super) fn answered(&mut self, named: &[String]) -> Vec<String> {
        let taken = std::mem::take(&mut self.taken);
        let mut inferred = Vec::new();
        self.unowed_turn = false;
        self.started = false;
        if !named.is_empty() {
            self.names_answers = true;
            self.drain_through(named);
        } else if !self.names_answers {
            if taken.is_empty() {
                if self.echoes {
                    inferred.extend(self.unanswered.pop_front().map(|(m, _)| m));
                } else {
                    self.unanswered.clear();
                }
            } else {
                self.drain_through(&taken);
                inferred = taken;
            }
        }
        inferred
    }

    fn drain_through(&mut self, ids: &[String]) {
        let anchor = self
            .unanswered
            .iter()
            .rposition(|(m, p)| ids.contains(m) && *p != Priority::Now)
            .map(|i| (i, self.unanswered[i].1));
        let mut index = 0;
        self.unanswered.retain(|(m, p)| {
            let i = index;
            index += 1;
            if ids.contains(m) {
                return false;
            }
            match anchor {
                // Taken before the anchor: in order, or jumping ahead (`now`); a `later`
                // one only behind a `later` anchor.
                Some((a, anchor_priority)) if i < a => {
                    *p == Priority::Later && anchor_priority != Priority::Later
                }
                _ => true,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// A result naming `named`: the turns still to come after it, and what it was found
    /// to answer.
    fn answer(o: &mut Owed, named: &[String]) -> (u32, Vec<String>) {
        let inferred = o.answered(named);
        (o.turns(), inferred)
    }

    fn sent(v: &[&str]) -> Owed {
        let mut o = Owed::default();
        for m in v {
            o.sent(m, None);
        }
        o
    }

    /// `now` jumps the queue and `later` waits behind it: a result naming one of them says
    /// nothing of the messages the CLI still holds, which stay owed (the session stays
    /// RUNNING until their answers).
    #[test]
    fn messages_sent_now_or_later_do_not_answer_those_they_overtake() {
        // first (running), queued (next), urgent (now): urgent is answered second.
        let mut o = Owed::default();
        o.sent("first", None);
        o.sent("queued", None);
        o.sent("urgent", Some(Priority::Now));
        assert_eq!(answer(&mut o, &ids(&["first"])).0, 2);
        assert_eq!(
            answer(&mut o, &ids(&["urgent"])).0,
            1,
            "queued is still owed"
        );
        assert_eq!(answer(&mut o, &ids(&["queued"])).0, 0);
        // first (running), deferred (later), next-one (next): next-one overtakes.
        let mut o = Owed::default();
        o.sent("first", None);
        o.sent("deferred", Some(Priority::Later));
        o.sent("next-one", None);
        assert_eq!(answer(&mut o, &ids(&["first"])).0, 2);
        assert_eq!(
            answer(&mut o, &ids(&["next-one"])).0,
            1,
            "deferred is still owed"
        );
        assert_eq!(answer(&mut o, &ids(&["deferred"])).0, 0);
        // An answered `later` one: everything sent before it was taken before it.
        let mut o = Owed::default();
        o.sent("a", Some(Priority::Later));
        o.sent("b", None);
        o.sent("c", Some(Priority::Later));
        assert_eq!(answer(&mut o, &ids(&["c"])).0, 0);
        // A `now` one before an answered in-order one went ahead of it.
        let mut o = Owed::default();
        o.sent("x", Some(Priority::Now));
        o.sent("y", None);
        assert_eq!(answer(&mut o, &ids(&["y"])).0, 0);
    }

    #[test]
    fn a_release_that_names_nothing_ends_everything_at_a_result() {
        let mut o = sent(&["a", "b"]);
        assert_eq!(answer(&mut o, &[]).0, 0);
        o.sent("c", None);
        assert_eq!(answer(&mut o, &[]).0, 0);
    }

    #[test]
    fn named_messages_and_those_before_them_are_answered_the_rest_are_owed() {
        let mut o = sent(&["a", "b", "c"]);
        assert_eq!(answer(&mut o, &ids(&["a"])).0, 2);
        // b and c merged into one turn.
        assert_eq!(answer(&mut o, &ids(&["b", "c"])).0, 0);

        // A result naming only the last of a merged batch answers the earlier ones too.
        let mut o = sent(&["a", "b", "c", "d"]);
        assert_eq!(answer(&mut o, &ids(&["c"])).0, 1);
        assert_eq!(answer(&mut o, &ids(&["d"])).0, 0);
    }

    #[test]
    fn a_turn_of_the_clis_own_leaves_the_queued_messages_owed() {
        let mut o = sent(&["a", "b"]);
        assert_eq!(answer(&mut o, &ids(&["a"])).0, 1);
        // A scheduled turn (no ids) or one naming an id ostler never sent.
        assert_eq!(answer(&mut o, &[]).0, 1);
        assert_eq!(answer(&mut o, &ids(&["cron-1"])).0, 1);
        assert_eq!(answer(&mut o, &ids(&["b"])).0, 0);
    }

    #[test]
    fn a_withdrawn_message_is_no_longer_owed() {
        let mut o = sent(&["a", "b", "c"]);
        assert!(o.withdrawn("b"));
        assert!(!o.withdrawn("b"), "only once");
        assert!(!o.withdrawn("zz"));
        assert_eq!(answer(&mut o, &ids(&["a"])).0, 1);
        assert!(o.withdrawn("c"));
        assert_eq!(answer(&mut o, &[]).0, 0);
    }

    #[test]
    fn echoes_say_what_a_result_that_names_nothing_answered() {
        // 1.0.128: the echo is not marked, it is known by its id; a and b answered one
        // turn each, c still owed.
        let mut o = sent(&["a", "b", "c"]);
        assert!(o.echoed("a"));
        assert!(!o.echoed("local-command"), "not an id written");
        assert_eq!(answer(&mut o, &[]), (2, ids(&["a"])));
        // 2.1.121: b and c merged into one turn, both echoed.
        assert!(o.echoed("b"));
        assert!(o.echoed("c"));
        assert!(o.echoed("c"), "an echo seen twice is named once");
        assert_eq!(answer(&mut o, &[]), (0, ids(&["b", "c"])));
    }

    #[test]
    fn a_result_with_no_echo_from_a_process_that_echoes_answers_the_oldest() {
        // 1.0.128 with "/cost" and "/foo" queued behind a prompt, then another prompt: the
        // prompt's turn (echoed), a result for each slash command (no echo), the prompt.
        let mut o = sent(&["a", "cost", "foo", "b"]);
        assert!(o.echoed("a"));
        assert_eq!(answer(&mut o, &[]), (3, ids(&["a"])));
        assert_eq!(answer(&mut o, &[]), (2, ids(&["cost"])));
        assert_eq!(answer(&mut o, &[]), (1, ids(&["foo"])));
        assert!(o.echoed("b"));
        assert_eq!(answer(&mut o, &[]), (0, ids(&["b"])));
        // Nothing owed: a result with no echo names nothing.
        assert_eq!(answer(&mut o, &[]), (0, vec![]));
    }

    #[test]
    fn before_any_echo_a_result_with_none_ends_whatever_ran() {
        // 1.0.59 never echoes; a slash command first on a process that does, likewise.
        let mut o = sent(&["cost", "a"]);
        assert_eq!(answer(&mut o, &[]), (0, vec![]));
        assert!(!o.taken_since_result());
    }

    #[test]
    fn a_message_the_cli_says_it_started_is_taken_until_the_next_result() {
        let mut o = sent(&["a", "b"]);
        assert_eq!(answer(&mut o, &ids(&["a"])).0, 1);
        o.started("not-sent");
        o.started("a");
        assert!(!o.taken_since_result(), "only a message still owed counts");
        o.started("b");
        assert!(o.taken_since_result());
        // It says nothing of what a result answered.
        assert_eq!(answer(&mut o, &ids(&["b"])), (0, vec![]));
        assert!(!o.taken_since_result());
    }

    #[test]
    fn forgetting_ends_every_turn_to_come() {
        let mut o = sent(&["a", "b"]);
        o.output();
        assert!(o.echoed("a"));
        assert!(o.taken_since_result());
        assert_eq!(answer(&mut o, &[]), (1, ids(&["a"])));
        assert!(!o.taken_since_result());
        assert_eq!(o.forget(), 1);
        assert_eq!(o.turns(), 0);
        let mut o = Owed::default();
        o.output();
        assert_eq!(o.forget(), 0);
        assert_eq!(o.turns(), 0);
    }

    #[test]
    fn echoes_do_not_override_a_release_that_names_its_answers() {
        let mut o = sent(&["a", "b"]);
        assert!(o.echoed("a"));
        assert_eq!(answer(&mut o, &ids(&["a"])), (1, vec![]));
        assert!(o.echoed("b"));
        // A turn of the CLI's own after the echo: b is still owed, nothing inferred.
        assert_eq!(answer(&mut o, &[]), (1, vec![]));
    }

    #[test]
    fn output_with_nothing_owed_is_a_turn_of_the_clis_own_until_a_result() {
        let mut o = Owed::default();
        assert_eq!(o.turns(), 0);
        o.output();
        o.output();
        assert_eq!(o.turns(), 1, "one turn, however much output");
        assert_eq!(answer(&mut o, &[]), (0, vec![]));

        // Output while a message is owed is that message's turn.
        let mut o = sent(&["a"]);
        o.output();
        assert_eq!(o.turns(), 1);
        // A message sent while the CLI runs a turn of its own: both are to come.
        let mut o = Owed::default();
        o.output();
        o.sent("a", None);
        assert_eq!(o.turns(), 2);
        // The result naming it ends both; a failed write takes back only the message.
        assert_eq!(answer(&mut o, &ids(&["a"])), (0, vec![]));
        o.output();
        o.sent("b", None);
        assert!(o.withdrawn("b"));
        assert_eq!(o.turns(), 1);
    }
}
