//! What a session process reports to its owner, in order.

use std::time::Duration;

use ostler_protocol::{DecodedLine, Event};

use super::control::Responder;
use super::types::ExitInfo;

/// What happens in a session process, in order.
#[derive(Debug)]
pub enum ProcessEvent {
    /// Every stdout line, decoded, in stdout order, delivered once with the responders
    /// of the control requests it carries.
    Line(Line),
    /// No output for `idle_for` while a turn runs and no permission prompt is open.
    Stall { idle_for: Duration },
    /// The process ended; always the last event.
    Exited(ExitInfo),
}

/// One stdout line, owned by the receiver: its raw bytes and events, and what the owner
/// must act on.
#[derive(Debug)]
pub struct Line {
    /// The raw line and its events. A control request from the CLI stays among the events
    /// (`Event::ControlRequest`); a `control_cancel_request` too (`Event::ControlCancel`).
    pub decoded: DecodedLine,
    /// One per `Event::ControlRequest` of `decoded.events`, in the same order. Answer each
    /// once; dropping one answers for the owner ([`super::NO_DECISION`]).
    pub responders: Vec<Responder>,
    /// The request ids this line's `control_cancel_request`s withdrew while they were open
    /// (a cancel of a request already answered or unknown is not listed), in order.
    pub cancelled: Vec<String>,
}

impl Line {
    /// A line the owner only has to record (no request to answer, nothing withdrawn).
    pub fn plain(decoded: DecodedLine) -> Self {
        Self {
            decoded,
            responders: Vec::new(),
            cancelled: Vec::new(),
        }
    }

    /// The events the line decoded to.
    pub fn events(&self) -> &[Event] {
        &self.decoded.events
    }

    /// Whether the line opens or withdraws a control request of the CLI.
    pub fn has_control(&self) -> bool {
        !self.responders.is_empty() || !self.cancelled.is_empty()
    }
}
