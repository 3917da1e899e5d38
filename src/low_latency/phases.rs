//! The one-call-in-flight rule of low-latency mode, as a pure function: the kernels number
//! calls on the device, so a send must be followed by its own receive before anything else.

use crate::error::BufferError;
use crate::low_latency::regions::{LlShape, invalid};
use kernels::contract::{PHASE_RECV, PHASE_SEND};

/// Which halves of a call a launch runs: both (the call returns with the data received),
/// or the send now and the receive later (`return_recv_hook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phases {
    SendAndReceive = (PHASE_SEND | PHASE_RECV) as isize,
    Send = PHASE_SEND as isize,
    Receive = PHASE_RECV as isize,
}

/// A send phase waiting for its receive: which call, of which shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingReceive {
    pub op: &'static str,
    pub shape: LlShape,
}

/// `Err` unless a launch of `phases` of `what` on `shape` may follow `pending` (the send
/// waiting for its receive, if any); `Ok` holds what is pending after the launch.
pub fn check_phases(
    what: &'static str,
    phases: Phases,
    shape: &LlShape,
    pending: Option<PendingReceive>,
) -> Result<Option<PendingReceive>, BufferError> {
    let this = PendingReceive {
        op: what,
        shape: *shape,
    };
    match (phases, pending) {
        (Phases::Receive, None) => Err(invalid(
            what,
            "no send phase is waiting for this receive: call each receive hook once".into(),
        )),
        (Phases::Receive, Some(sent)) if sent != this => Err(invalid(
            what,
            format!(
                "this receive does not match the pending send ({} of {:?}): call the hook \
                 that call returned",
                sent.op, sent.shape
            ),
        )),
        (Phases::Send | Phases::SendAndReceive, Some(sent)) => Err(invalid(
            what,
            format!(
                "the receive hook of the previous {} has not been called: call it first \
                 (one low-latency call in flight per buffer)",
                sent.op
            ),
        )),
        (Phases::Send, None) => Ok(Some(this)),
        _ => Ok(None),
    }
}
