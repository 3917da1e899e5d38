//! The model's state and moves: the rings, the puts and head returns in flight, and one random
//! step of some rank at a time, each checked as it happens.

use rand::rngs::StdRng;

use super::harness::{self, HeadOp, Schedule};
use super::{MAX_CHUNKS, Protocol};

/// What a landing or staging slot holds: (source rank, call, the token's index in the call).
type Tag = (usize, usize, usize);

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    tag: Option<Tag>,
    /// Landing: written, not yet read by the forwarder. Staging: a put still has to read it.
    owed: bool,
}

/// A chunk's put in flight: slots [p, p + m) of staging ring (from, node k) into landing ring
/// (to, from's node).
#[derive(Debug, Clone)]
struct Put {
    from: usize,
    to: usize,
    p: u64,
    tags: Vec<Tag>,
}

struct Sender {
    cursor: usize,
    /// Per destination node: the next position, and the start of the first chunk not posted.
    pos: Vec<u64>,
    posted: Vec<u64>,
}

pub(super) struct Model {
    n: usize,
    g: usize,
    protocol: Protocol,
    /// routing[call][rank][token]: the destination nodes of each token, as a bit mask.
    routing: Vec<Vec<Vec<u64>>>,
    call: usize,
    senders: Vec<Sender>,
    /// Forwarder f's next position and tokens still to come, per source node.
    fwd_pos: Vec<Vec<u64>>,
    fwd_left: Vec<Vec<usize>>,
    fwd_seen: Vec<Vec<usize>>,
    landing: Vec<Vec<Vec<Slot>>>, // [forwarder][source node][slot]
    staging: Vec<Vec<Vec<Slot>>>, // [sender][destination node][slot]
    words: Vec<Vec<Vec<u64>>>,    // [forwarder][source node][chunk of the ring]
    tails: Vec<Vec<u64>>,         // [forwarder][source node]: the mutation's one tail
    heads: Vec<Vec<u64>>,         // [sender][destination node]
    puts: Vec<Put>,
    head_ops: Vec<HeadOp>,
}

impl Model {
    pub(super) fn new(n: usize, g: usize, routing: Vec<Vec<Vec<u64>>>, protocol: Protocol) -> Self {
        let nodes = n / g;
        let ring = || vec![vec![Slot::default(); protocol.ring]; nodes];
        let mut model = Self {
            n,
            g,
            protocol,
            routing,
            call: 0,
            senders: Vec::new(),
            fwd_pos: vec![vec![0; nodes]; n],
            fwd_left: vec![vec![0; nodes]; n],
            fwd_seen: vec![vec![0; nodes]; n],
            landing: (0..n).map(|_| ring()).collect(),
            staging: (0..n).map(|_| ring()).collect(),
            words: vec![vec![vec![0; MAX_CHUNKS]; nodes]; n],
            tails: vec![vec![0; nodes]; n],
            heads: vec![vec![0; nodes]; n],
            puts: Vec::new(),
            head_ops: Vec::new(),
        };
        model.senders = (0..n)
            .map(|_| Sender {
                cursor: 0,
                pos: vec![0; nodes],
                posted: vec![0; nodes],
            })
            .collect();
        model.start_call();
        model
    }

    fn nodes(&self) -> usize {
        self.n / self.g
    }
    /// The chunk of the call in progress (the config's, which may change between calls).
    fn chunk(&self) -> usize {
        harness::call_chunk(self.protocol.chunk, self.protocol.odd_chunk, self.call)
    }
    /// The word of the chunk at position p.
    fn word_index(&self, p: u64) -> usize {
        harness::word_index(p, self.chunk(), self.protocol.ring)
    }
    /// The source of node b that forwarder f hears from: its rail peer there.
    fn rail_peer(&self, f: usize, b: usize) -> usize {
        b * self.g + f % self.g
    }
    /// Tokens of rank s's call-`call` stream to node k, in order (the notify's handle 3).
    fn stream(&self, s: usize, k: usize) -> Vec<usize> {
        let tokens = &self.routing[self.call][s];
        (0..tokens.len())
            .filter(|&t| tokens[t] >> k & 1 == 1)
            .collect()
    }

    fn write_landing(&mut self, f: usize, b: usize, p: u64, tag: Tag) -> Result<(), String> {
        let slot = &mut self.landing[f][b][p as usize % self.protocol.ring];
        if slot.owed {
            return Err(format!(
                "{tag:?} lands at position {p} of forwarder {f}'s ring from node {b} over {:?}, \
                 not yet forwarded",
                slot.tag
            ));
        }
        *slot = Slot {
            tag: Some(tag),
            owed: true,
        };
        Ok(())
    }

    /// Chunk [p, p + m) of sender s's stream to node k is complete: its put leaves (own node:
    /// the slots are in place, the word is stored).
    fn post(&mut self, s: usize, k: usize, p: u64, m: u64) -> Result<(), String> {
        let f = self.rail_peer(s, k);
        let b = s / self.g;
        let ring = self.protocol.ring as u64;
        if p % ring + m > ring {
            return Err(format!(
                "sender {s}'s chunk [{p}, {}) to node {k} crosses the ring's end: its one put \
                 writes past the ring",
                p + m
            ));
        }
        if k == b {
            self.signal(f, b, p, m);
            return Ok(());
        }
        let tags = (p..p + m)
            .map(|q| self.staging[s][k][(q % ring) as usize].tag.unwrap())
            .collect();
        self.puts.push(Put {
            from: s,
            to: f,
            p,
            tags,
        });
        Ok(())
    }

    /// The chunk's signal on forwarder f for source node b: its word set to p + m, or, mutated,
    /// the one tail advanced by the chunk's span (c positions, the last one rounded).
    fn signal(&mut self, f: usize, b: usize, p: u64, m: u64) {
        if self.protocol.chunk_words {
            let word = self.word_index(p);
            self.words[f][b][word] = p + m;
        } else {
            self.tails[f][b] += self.chunk() as u64;
        }
    }

    /// Sender s's next window, if its ring space allows: Ok(false) when it must wait.
    fn send_window(&mut self, s: usize) -> Result<bool, String> {
        let (w, c, ring) = (
            self.protocol.window,
            self.chunk() as u64,
            self.protocol.ring as u64,
        );
        let tokens = self.routing[self.call][s].clone();
        let cursor = self.senders[s].cursor;
        let end = (cursor + w).min(tokens.len());
        let count = |k: usize| (cursor..end).filter(|&t| tokens[t] >> k & 1 == 1).count() as u64;
        let fits = (0..self.nodes()).all(|k| {
            let need = (self.senders[s].pos[k] + count(k)).saturating_sub(ring);
            !self.protocol.space_wait || self.heads[s][k] >= need
        });
        if !fits {
            return Ok(false);
        }
        let own = s / self.g;
        for (t, &mask) in tokens.iter().enumerate().take(end).skip(cursor) {
            for k in (0..self.nodes()).filter(|&k| mask >> k & 1 == 1) {
                let p = self.senders[s].pos[k];
                self.senders[s].pos[k] += 1;
                let tag = (s, self.call, t);
                if k == own {
                    self.write_landing(s, own, p, tag)?;
                    continue;
                }
                let slot = &mut self.staging[s][k][(p % ring) as usize];
                if slot.owed {
                    return Err(format!(
                        "sender {s} stages {tag:?} at position {p} for node {k} over {:?}, \
                         which a put has not read yet",
                        slot.tag
                    ));
                }
                *slot = Slot {
                    tag: Some(tag),
                    owed: true,
                };
            }
        }
        self.senders[s].cursor = end;
        let done = end == tokens.len();
        for k in 0..self.nodes() {
            // Whole chunks leave as they fill; the stream's last one when the call's tokens end.
            while self.senders[s].posted[k] < self.senders[s].pos[k] {
                let (p, pos) = (self.senders[s].posted[k], self.senders[s].pos[k]);
                let m = (pos - p).min(c);
                if m < c && !done {
                    break;
                }
                self.post(s, k, p, m)?;
                self.senders[s].posted[k] = p + c;
            }
            if done {
                // The next call starts on a chunk (both ends round alike).
                let pos = &mut self.senders[s].pos[k];
                *pos = pos.next_multiple_of(c);
                self.senders[s].posted[k] = *pos;
            }
        }
        Ok(true)
    }

    fn deliver_put(&mut self, i: usize) -> Result<(), String> {
        let put = self.puts.swap_remove(i);
        let (b, k, ring) = (
            put.from / self.g,
            put.to / self.g,
            self.protocol.ring as u64,
        );
        for (q, &tag) in (put.p..).zip(&put.tags) {
            self.write_landing(put.to, b, q, tag)?;
            self.staging[put.from][k][(q % ring) as usize].owed = false;
        }
        self.signal(put.to, b, put.p, put.tags.len() as u64);
        Ok(())
    }

    fn deliver_head(&mut self, i: usize) -> Result<(), String> {
        let op = self.head_ops.swap_remove(i);
        op.land(&mut self.heads, self.protocol.head_add, "sender")
    }

    /// Forwarder f takes one ready chunk from source node b, if there is one.
    fn forward(&mut self, f: usize, b: usize) -> Result<bool, String> {
        let (c, ring) = (self.chunk() as u64, self.protocol.ring as u64);
        let left = self.fwd_left[f][b] as u64;
        let p = self.fwd_pos[f][b];
        let m = left.min(c);
        let ready = if self.protocol.chunk_words {
            self.words[f][b][self.word_index(p)] > p
        } else {
            self.tails[f][b] >= p + c
        };
        if m == 0 || !ready {
            return Ok(false);
        }
        let s = self.rail_peer(f, b);
        let stream = self.stream(s, f / self.g);
        for q in p..p + m {
            let want = (s, self.call, stream[self.fwd_seen[f][b]]);
            let slot = &mut self.landing[f][b][(q % ring) as usize];
            if !slot.owed || slot.tag != Some(want) {
                return Err(format!(
                    "forwarder {f} reads position {q} from node {b} for {want:?}: it holds {:?} \
                     (landed: {})",
                    slot.tag, slot.owed
                ));
            }
            slot.owed = false;
            self.fwd_seen[f][b] += 1;
        }
        self.fwd_left[f][b] -= m as usize;
        self.fwd_pos[f][b] = p + c; // a chunk spans c positions (the last one: rounded)
        let value = if self.protocol.head_add { c } else { p + c };
        let op = HeadOp {
            to: s,
            node: f / self.g,
            value,
        };
        if b == f / self.g {
            // Our own sender: a store of the count, in order.
            self.heads[s][op.node] = p + c;
        } else {
            self.head_ops.push(op);
        }
        Ok(true)
    }
}

impl Schedule for Model {
    fn calls(&mut self) -> (&mut usize, usize) {
        (&mut self.call, self.routing.len())
    }
    fn call_done(&self) -> bool {
        (0..self.n).all(|r| {
            self.senders[r].cursor == self.routing[self.call][r].len()
                && self.fwd_left[r].iter().all(|&left| left == 0)
        })
    }
    /// A new dispatch after the barrier: cursors back to 0, each forwarder told its counts.
    fn start_call(&mut self) {
        let c = self.chunk() as u64;
        for s in 0..self.n {
            self.senders[s].cursor = 0;
            if self.protocol.round_at_start {
                for k in 0..self.nodes() {
                    let pos = self.senders[s].pos[k].next_multiple_of(c);
                    self.senders[s].pos[k] = pos;
                    self.senders[s].posted[k] = pos;
                }
            }
        }
        for f in 0..self.n {
            for b in 0..self.nodes() {
                self.fwd_left[f][b] = self.stream(self.rail_peer(f, b), f / self.g).len();
                self.fwd_seen[f][b] = 0;
                let was = self.fwd_pos[f][b];
                let pos = was.next_multiple_of(c);
                if !self.protocol.round_at_start || pos == was {
                    continue;
                }
                // The skipped positions back to the sender's head (own node: a store).
                self.fwd_pos[f][b] = pos;
                let (s, node) = (self.rail_peer(f, b), f / self.g);
                if b == node {
                    self.heads[s][node] = pos;
                } else {
                    let value = if self.protocol.head_add {
                        pos - was
                    } else {
                        pos
                    };
                    self.head_ops.push(HeadOp { to: s, node, value });
                }
            }
        }
    }
    fn one_move(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let nodes = self.nodes();
        let mut moves: Vec<(u8, usize)> = Vec::new();
        for r in 0..self.n {
            if self.senders[r].cursor < self.routing[self.call][r].len() {
                moves.push((0, r));
            }
            moves.extend((0..nodes).map(|b| (1, r * nodes + b)));
        }
        moves.extend((0..self.puts.len()).map(|i| (2, i)));
        moves.extend((0..self.head_ops.len()).map(|i| (3, i)));
        let call = self.call;
        let try_move = |(kind, i): (u8, usize), _: &mut StdRng| match kind {
            0 => self.send_window(i),
            1 => self.forward(i / nodes, i % nodes),
            2 => self.deliver_put(i).map(|_| true),
            _ => self.deliver_head(i).map(|_| true),
        };
        harness::one_move(moves, rng, try_move, || {
            format!(
                "deadlock in call {call}: every sender waits for space, every forwarder for a chunk"
            )
        })
    }
}
