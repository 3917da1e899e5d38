//! The model's state and moves: the sub-rings, the RDMA rings, the puts and head returns in
//! flight, and one random step of some rank at a time, each checked as it happens.

use rand::Rng;
use rand::rngs::StdRng;

use super::{MAX_CHUNKS, Protocol};
use crate::internode_dispatch_protocol_tests::harness::{self, HeadOp, Schedule};

/// What a slot holds: (writer rank, call, home rank, token): a member's piece in a sub-ring, a
/// forwarder's sum in staging or landing.
type Tag = (usize, usize, usize, usize);

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    tag: Option<Tag>,
    /// Written and not yet read (staging: a put has not read it yet).
    owed: bool,
}

impl Slot {
    /// Writes `tag`, unless the slot still owes a read.
    fn write(&mut self, tag: Tag, what: &str) -> Result<(), String> {
        if self.owed {
            return Err(format!(
                "{what}: {tag:?} overwrites {:?}, not yet read",
                self.tag
            ));
        }
        *self = Slot {
            tag: Some(tag),
            owed: true,
        };
        Ok(())
    }
    /// Reads `want`, which must be there and unread.
    fn read(&mut self, want: Tag, what: &str) -> Result<(), String> {
        if !self.owed || self.tag != Some(want) {
            return Err(format!(
                "{what}: expects {want:?}, holds {:?} (unread: {})",
                self.tag, self.owed
            ));
        }
        self.owed = false;
        Ok(())
    }
}

/// A chunk's put in flight: sums [p, p + m) of forwarder `from`'s staging ring to node `node`,
/// into landing ring (from's node) on home rank `to`.
#[derive(Debug, Clone)]
struct Put {
    from: usize,
    node: usize,
    to: usize,
    p: u64,
    tags: Vec<Tag>,
}

/// [rank][member or local index][node], the shape of every NVL word and ring.
type PerMemberNode<T> = Vec<Vec<Vec<T>>>;

pub(super) struct Model {
    protocol: Protocol,
    /// Ranks, in nodes of g; the call's RDMA chunk (the config's, which may change between calls).
    n: usize,
    g: usize,
    nodes: usize,
    chunk: usize,
    /// routing[call][home][token]: the ranks the token went to in the dispatch, as a bit mask.
    routing: Vec<Vec<Vec<u64>>>,
    call: usize,
    // NVL stage: sub-ring (member l', node b) on forwarder f; its tail there; on sender s the
    // head from forwarder l, its position and the rows sent this call; the forwarder's position.
    sub_rings: PerMemberNode<Vec<Slot>>,
    nvl_tails: PerMemberNode<u64>,
    nvl_heads: PerMemberNode<u64>,
    nvl_sent: PerMemberNode<u64>,
    nvl_rows: PerMemberNode<usize>,
    nvl_read: PerMemberNode<u64>,
    // RDMA stage: the forwarder's position, rows left and taken per destination node; staging
    // [forwarder][node], landing [home][node]; words and (mutated) tails [home][node]; heads
    // [forwarder][node]; the home receiver's base, returned head, received position, cursor.
    fwd_pos: Vec<Vec<u64>>,
    fwd_left: Vec<Vec<usize>>,
    fwd_taken: Vec<Vec<usize>>,
    staging: Vec<Vec<Vec<Slot>>>,
    landing: Vec<Vec<Vec<Slot>>>,
    words: Vec<Vec<Vec<u64>>>,
    tails: Vec<Vec<u64>>,
    heads: Vec<Vec<u64>>,
    home_base: Vec<Vec<u64>>,
    home_returned: Vec<Vec<u64>>,
    home_received: Vec<Vec<u64>>,
    home_cursor: Vec<usize>,
    home_done: Vec<bool>,
    puts: Vec<Put>,
    head_ops: Vec<HeadOp>,
}

impl Model {
    pub(super) fn new(n: usize, g: usize, routing: Vec<Vec<Vec<u64>>>, protocol: Protocol) -> Self {
        let nodes = n / g;
        let per = |x: u64| vec![vec![vec![x; nodes]; g]; n];
        let ring = |size: usize| vec![vec![vec![Slot::default(); size]; nodes]; n];
        let words = vec![vec![0u64; nodes]; n];
        let mut model = Self {
            n,
            g,
            protocol,
            routing,
            call: 0,
            nodes,
            chunk: protocol.chunk,
            sub_rings: vec![vec![vec![vec![Slot::default(); protocol.sub_ring]; nodes]; g]; n],
            nvl_tails: per(0),
            nvl_heads: per(0),
            nvl_sent: per(0),
            nvl_rows: vec![vec![vec![0; nodes]; g]; n],
            nvl_read: per(0),
            fwd_pos: words.clone(),
            fwd_left: vec![vec![0; nodes]; n],
            fwd_taken: vec![vec![0; nodes]; n],
            staging: ring(protocol.ring),
            landing: ring(protocol.ring),
            words: vec![vec![vec![0; MAX_CHUNKS]; nodes]; n],
            tails: words.clone(),
            heads: words.clone(),
            home_base: words.clone(),
            home_returned: words.clone(),
            home_received: words,
            home_cursor: vec![0; n],
            home_done: vec![false; n],
            puts: Vec::new(),
            head_ops: Vec::new(),
        };
        model.start_call();
        model
    }

    /// The word of the chunk at position p of a ring (this call's chunk).
    fn word(&self, p: u64) -> usize {
        harness::word_index(p, self.chunk, self.protocol.ring)
    }
    /// The ranks token t of home h went to.
    fn dest(&self, h: usize, t: usize) -> u64 {
        self.routing[self.call][h][t]
    }
    fn hits_node(&self, h: usize, t: usize, k: usize) -> bool {
        let node_mask = ((1u64 << self.g) - 1) << (k * self.g);
        self.dest(h, t) & node_mask != 0
    }
    /// The forwarder's stream to node b: home (b, our local index)'s tokens that went to our
    /// node, in order (handles 3-4: the rows it forwarded in the dispatch).
    fn fwd_stream(&self, f: usize, b: usize) -> Vec<usize> {
        let h = b * self.g + f % self.g;
        (0..self.routing[self.call][h].len())
            .filter(|&t| self.hits_node(h, t, f / self.g))
            .collect()
    }
    /// Member s's stream back to forwarder l of its node for node b: the tokens of home (b, l)
    /// that went to s, in order (handle 5's range on s).
    fn nvl_stream(&self, s: usize, l: usize, b: usize) -> Vec<usize> {
        let h = b * self.g + l;
        (0..self.routing[self.call][h].len())
            .filter(|&t| self.dest(h, t) >> s & 1 == 1)
            .collect()
    }

    /// Home h's positions of ring (from node k) up to `now` go back to its writer, forwarder
    /// (k, h's local index): by ADD (mutated: SET) in flight, or on our own node by a store.
    fn return_head(&mut self, h: usize, k: usize, now: u64) {
        let was = self.home_returned[h][k];
        if now <= was {
            return;
        }
        self.home_returned[h][k] = now;
        let (f, node) = (k * self.g + h % self.g, h / self.g);
        if k == node {
            self.heads[f][node] = now;
            return;
        }
        let value = if self.protocol.head_add {
            now - was
        } else {
            now
        };
        self.head_ops.push(HeadOp { to: f, node, value });
    }

    /// NVL sender s toward forwarder l of its node: one window of a stream with space.
    fn nvl_send(&mut self, s: usize, l: usize, rng: &mut StdRng) -> Result<bool, String> {
        let (g, nodes, p) = (self.g, self.nodes, self.protocol);
        let f = s / g * g + l;
        let left = |m: &Self, b: usize| m.nvl_stream(s, l, b).len() - m.nvl_rows[s][l][b];
        let has_space = |m: &Self, b: usize| {
            let w = left(m, b).min(p.window) as u64;
            let need = (m.nvl_sent[s][l][b] + w).saturating_sub(p.sub_ring as u64);
            !p.nvl_space_wait || m.nvl_heads[s][l][b] >= need
        };
        let mut candidates: Vec<usize> = (0..nodes).filter(|&b| left(self, b) > 0).collect();
        if !p.nvl_poll {
            // One stream at a time, from our own node on: the first unfinished one, or nothing.
            let own = s / g;
            candidates.sort_by_key(|&b| (b + nodes - own) % nodes);
            candidates.truncate(1);
        }
        candidates.retain(|&b| has_space(self, b));
        if candidates.is_empty() {
            return Ok(false);
        }
        let b = candidates[rng.random_range(0..candidates.len())];
        let stream = self.nvl_stream(s, l, b);
        let (done, pos) = (self.nvl_rows[s][l][b], self.nvl_sent[s][l][b]);
        let w = (stream.len() - done).min(p.window);
        let h = b * g + l;
        for (i, &t) in stream[done..done + w].iter().enumerate() {
            let q = (pos + i as u64) as usize % p.sub_ring;
            let what = format!(
                "member {s} writes sub-ring (node {b}) on forwarder {f} at {}",
                pos + i as u64
            );
            self.sub_rings[f][s % g][b][q].write((s, self.call, h, t), &what)?;
        }
        self.nvl_sent[s][l][b] = pos + w as u64;
        self.nvl_rows[s][l][b] = done + w;
        self.nvl_tails[f][s % g][b] = pos + w as u64;
        Ok(true)
    }

    /// Forwarder f's next chunk to node b, if ring space and every member's pieces are there.
    fn forward(&mut self, f: usize, b: usize) -> Result<bool, String> {
        let (g, p) = (self.g, self.protocol);
        let (c, ring) = (self.chunk as u64, p.ring as u64);
        let m = self.fwd_left[f][b].min(c as usize);
        let pos = self.fwd_pos[f][b];
        if m == 0 || self.heads[f][b] < (pos + m as u64).saturating_sub(ring) {
            return Ok(false);
        }
        let taken = self.fwd_taken[f][b];
        let rows: Vec<usize> = self.fwd_stream(f, b)[taken..taken + m].to_vec();
        let (h, node) = (b * g + f % g, f / g);
        // Member l' got the rows whose token went to it; our own pieces are in x.
        let got = |l: usize| -> Vec<usize> {
            rows.iter()
                .copied()
                .filter(|&t| self.dest(h, t) >> (node * g + l) & 1 == 1)
                .collect()
        };
        let pieces: Vec<Vec<usize>> = (0..g).map(got).collect();
        let ready = (0..g).all(|l| {
            l == f % g || self.nvl_tails[f][l][b] >= self.nvl_read[f][l][b] + pieces[l].len() as u64
        });
        if !ready {
            return Ok(false);
        }
        for (l, tokens) in pieces.iter().enumerate().filter(|&(l, _)| l != f % g) {
            let s = node * g + l;
            let at = self.nvl_read[f][l][b];
            for (i, &t) in tokens.iter().enumerate() {
                let q = (at + i as u64) as usize % p.sub_ring;
                let what = format!(
                    "forwarder {f} reads member {s}'s sub-ring (node {b}) at {}",
                    at + i as u64
                );
                self.sub_rings[f][l][b][q].read((s, self.call, h, t), &what)?;
            }
            self.nvl_read[f][l][b] = at + tokens.len() as u64;
            self.nvl_heads[s][f % g][b] = self.nvl_read[f][l][b]; // a store through node_peer
        }
        if pos % ring + m as u64 > ring {
            return Err(format!(
                "forwarder {f}'s chunk [{pos}, {}) to node {b} crosses the ring's end: its one \
                 put writes past the ring",
                pos + m as u64
            ));
        }
        let tags: Vec<Tag> = rows.iter().map(|&t| (f, self.call, h, t)).collect();
        for (i, &tag) in tags.iter().enumerate() {
            let q = ((pos + i as u64) % ring) as usize;
            if b == node {
                let what = format!(
                    "forwarder {f} stores into its own landing ring at {}",
                    pos + i as u64
                );
                self.landing[f][node][q].write(tag, &what)?;
            } else {
                let what = format!("forwarder {f} stages for node {b} at {}", pos + i as u64);
                self.staging[f][b][q].write(tag, &what)?;
            }
        }
        if b == node {
            self.signal(f, node, pos, m as u64);
        } else {
            self.puts.push(Put {
                from: f,
                node: b,
                to: h,
                p: pos,
                tags,
            });
        }
        self.fwd_pos[f][b] = pos + c; // a chunk spans c positions (the call's last: rounded)
        self.fwd_left[f][b] -= m;
        self.fwd_taken[f][b] += m;
        Ok(true)
    }

    /// The chunk's signal on home h for ring (from node k): its word set to p + m, or, mutated,
    /// the one tail advanced by the chunk's span.
    fn signal(&mut self, h: usize, k: usize, p: u64, m: u64) {
        if self.protocol.chunk_words {
            let word = self.word(p);
            self.words[h][k][word] = p + m;
        } else {
            self.tails[h][k] += self.chunk as u64;
        }
    }

    /// Put i lands: its sums into the home's landing ring (each write checked against the read
    /// owed there), its staging slots free again, then its signal.
    fn land_put(&mut self, i: usize) -> Result<bool, String> {
        let Put {
            from,
            node,
            to,
            p,
            tags,
        } = self.puts.swap_remove(i);
        let ring = self.protocol.ring as u64;
        let slots = (p..p + tags.len() as u64).map(|q| (q % ring) as usize);
        let what = format!("forwarder {from}'s put [{p}, ..) lands on home {to}");
        for (slot, &tag) in slots.clone().zip(&tags) {
            self.landing[to][from / self.g][slot].write(tag, &what)?;
        }
        slots.for_each(|slot| self.staging[from][node][slot].owed = false);
        self.signal(to, from / self.g, p, tags.len() as u64);
        Ok(true)
    }

    /// Token t of home h: the position of its sum in ring (from node k), if it went there.
    fn position(&self, h: usize, t: usize, k: usize) -> Option<u64> {
        if !self.hits_node(h, t, k) {
            return None;
        }
        let before = (0..t).filter(|&u| self.hits_node(h, u, k)).count();
        Some(self.home_base[h][k] + before as u64)
    }

    /// Home h's next round of tokens, once every sum of it landed: read, then heads returned up
    /// to the round's last position per ring (and at the call's end, to its rounded end).
    fn home_round(&mut self, h: usize) -> Result<bool, String> {
        let (g, nodes, ring) = (self.g, self.nodes, self.protocol.ring as u64);
        let len = self.routing[self.call][h].len();
        let cursor = self.home_cursor[h];
        if self.home_done[h] {
            return Ok(false);
        }
        let end = (cursor + self.protocol.round).min(len);
        let wanted: Vec<(usize, usize, u64)> = (cursor..end)
            .flat_map(|t| (0..nodes).map(move |k| (t, k)))
            .filter_map(|(t, k)| self.position(h, t, k).map(|p| (t, k, p)))
            .collect();
        let landed = |m: &Self, k: usize, p: u64| {
            if m.protocol.chunk_words {
                m.words[h][k][m.word(p)] > p
            } else {
                m.tails[h][k] > p
            }
        };
        if !wanted.iter().all(|&(_, k, p)| landed(self, k, p)) {
            return Ok(false);
        }
        let mut last = vec![None; nodes];
        for &(t, k, p) in &wanted {
            let f = k * g + h % g;
            let what = format!("home {h} reads node {k}'s sum at {p}");
            self.landing[h][k][(p % ring) as usize].read((f, self.call, h, t), &what)?;
            last[k] = Some(p + 1);
        }
        for (k, last) in last.into_iter().enumerate() {
            if let Some(now) = last {
                self.return_head(h, k, now);
            }
        }
        self.home_cursor[h] = end;
        if end == len {
            // The call's end, zero tokens included: on to its rounded end.
            self.home_done[h] = true;
            let c = self.chunk as u64;
            for k in 0..nodes {
                let count = self.fwd_stream(k * g + h % g, h / g).len() as u64;
                let done = (self.home_base[h][k] + count).next_multiple_of(c);
                self.return_head(h, k, done);
                self.home_received[h][k] = done;
            }
        }
        Ok(true)
    }
}

impl Schedule for Model {
    fn calls(&mut self) -> (&mut usize, usize) {
        (&mut self.call, self.routing.len())
    }
    fn call_done(&self) -> bool {
        (0..self.n).all(|r| self.home_done[r] && self.fwd_left[r].iter().all(|&left| left == 0))
    }
    /// A new combine after the barrier: per-call counts from the routing, positions rounded to
    /// the call's chunk (the home returns what it skipped).
    fn start_call(&mut self) {
        let p = self.protocol;
        self.chunk = harness::call_chunk(p.chunk, p.odd_chunk, self.call);
        let c = self.chunk as u64;
        for f in 0..self.n {
            for b in 0..self.nodes {
                if self.protocol.round_at_start {
                    self.fwd_pos[f][b] = self.fwd_pos[f][b].next_multiple_of(c);
                }
                self.fwd_left[f][b] = self.fwd_stream(f, b).len();
                self.fwd_taken[f][b] = 0;
            }
        }
        for s in 0..self.n {
            for row in &mut self.nvl_rows[s] {
                row.fill(0);
            }
        }
        for h in 0..self.n {
            self.home_cursor[h] = 0;
            self.home_done[h] = false;
            for k in 0..self.nodes {
                let was = self.home_received[h][k];
                let base = if self.protocol.round_at_start {
                    was.next_multiple_of(c)
                } else {
                    was
                };
                self.home_base[h][k] = base;
                self.home_returned[h][k] = was;
                self.return_head(h, k, base);
            }
        }
    }
    fn one_move(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let (g, nodes) = (self.g, self.nodes);
        // (role, index): NVL sender (rank, forwarder of its node), forwarder (rank, node), put,
        // head return, home receiver (rank).
        let mut moves: Vec<(u8, usize)> = Vec::new();
        for r in 0..self.n {
            moves.extend((0..g).filter(|&l| l != r % g).map(|l| (0, r * g + l)));
            moves.extend((0..nodes).map(|b| (1, r * nodes + b)));
            moves.push((4, r));
        }
        moves.extend((0..self.puts.len()).map(|i| (2, i)));
        moves.extend((0..self.head_ops.len()).map(|i| (3, i)));
        let call = self.call;
        let try_move = |(role, i): (u8, usize), rng: &mut StdRng| match role {
            0 => self.nvl_send(i / g, i % g, rng),
            1 => self.forward(i / nodes, i % nodes),
            2 => self.land_put(i),
            3 => {
                let op = self.head_ops.swap_remove(i);
                op.land(&mut self.heads, self.protocol.head_add, "forwarder")
                    .map(|_| true)
            }
            _ => self.home_round(i),
        };
        harness::one_move(moves, rng, try_move, || {
            format!("deadlock in call {call}: every sender, forwarder and home receiver waits")
        })
    }
}
