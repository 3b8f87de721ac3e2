//! The tool-call deltas of one streamed reply: each call's header (`index`, `id`, `name`) once its
//! name is known, then its argument fragments in order. The scanners of `tool_scan` report what
//! they find here; [`crate::tool_stream::ToolCallStream`] sends what is pending with each chunk.

use serde_json::{json, Value as Json};

use crate::tool_parse::new_call_id;

/// One entry of a chunk's `delta.tool_calls`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallDelta {
    /// The call's position in the reply.
    pub index: usize,
    /// `(id, name)` on a call's first delta.
    pub header: Option<(String, String)>,
    /// A fragment of the arguments JSON.
    pub arguments: String,
}

impl CallDelta {
    /// The delta's JSON, as OpenAI streams it.
    pub fn to_json(&self) -> Json {
        match &self.header {
            Some((id, name)) => json!({"index": self.index, "id": id, "type": "function",
                                       "function": {"name": name, "arguments": self.arguments}}),
            None => json!({"index": self.index, "function": {"arguments": self.arguments}}),
        }
    }
}

/// One entry per call index (a call's header and its first fragments sent together).
pub fn merge_deltas(deltas: Vec<CallDelta>) -> Vec<CallDelta> {
    let mut out: Vec<CallDelta> = Vec::with_capacity(deltas.len());
    for d in deltas {
        match out.last_mut() {
            Some(last) if last.index == d.index => last.arguments.push_str(&d.arguments),
            _ => out.push(d),
        }
    }
    out
}

#[derive(Default)]
struct Slot {
    index: Option<usize>,
    id: String,
    args: String,
    held: String,
}

/// The calls of one reply and the deltas waiting to be sent.
#[derive(Default)]
pub(crate) struct Calls {
    slots: Vec<Slot>,
    started: usize,
    pending: Vec<CallDelta>,
}

impl Calls {
    pub(crate) fn new_call(&mut self) -> usize {
        self.slots.push(Slot::default());
        self.slots.len() - 1
    }

    pub(crate) fn start(&mut self, call: usize, name: &str) {
        if self.slots[call].index.is_some() {
            return;
        }
        let index = self.started;
        self.started += 1;
        let id = new_call_id();
        let slot = &mut self.slots[call];
        slot.index = Some(index);
        slot.id = id.clone();
        self.pending.push(CallDelta {
            index,
            header: Some((id, name.to_string())),
            arguments: String::new(),
        });
        let held = std::mem::take(&mut self.slots[call].held);
        self.args(call, &held);
    }

    pub(crate) fn args(&mut self, call: usize, frag: &str) {
        if frag.is_empty() {
            return;
        }
        let slot = &mut self.slots[call];
        let Some(index) = slot.index else {
            slot.held.push_str(frag); // arguments before the name: held until the call starts
            return;
        };
        slot.args.push_str(frag);
        self.pending.push(CallDelta {
            index,
            header: None,
            arguments: frag.to_string(),
        });
    }

    pub(crate) fn finish(&mut self, call: usize) {
        let s = &self.slots[call];
        if s.index.is_some() && s.args.is_empty() {
            self.args(call, "{}");
        }
    }

    /// Call `call` has arguments already (its next fragment is not its first).
    pub(crate) fn has_args(&self, call: usize) -> bool {
        !self.slots[call].args.is_empty()
    }

    /// Some call has started (the reply called a tool).
    pub(crate) fn any_started(&self) -> bool {
        self.started > 0
    }

    /// Call `call`'s id (empty until it starts).
    pub(crate) fn id(&self, call: usize) -> &str {
        &self.slots[call].id
    }

    /// Arguments of `call` that the caller sends itself (not queued as a delta).
    pub(crate) fn record_args(&mut self, call: usize, frag: &str) {
        self.slots[call].args.push_str(frag);
    }

    pub(crate) fn take(&mut self) -> Vec<CallDelta> {
        std::mem::take(&mut self.pending)
    }
}
