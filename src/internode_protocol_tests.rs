//! The internode notify's reuse argument (kernels/cuda/buffer/internode_notify.cu, NOTES), run
//! as a model: ranks make a sequence of notifies (full and cached) under random interleavings of
//! every block's steps and every put's delivery, and each write into a rows slot or a staging
//! slot is checked against the reads still owed on what it overwrites. Nothing is reset, as in
//! the kernel: signals add, tickets hold call numbers, rows and staging go by the parity of the
//! notifies with rows. Mutations (one parity instead of two, no node tickets) must fail, which
//! shows the model can see what it checks.

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which protocol the model runs: the kernel's, or one with a part taken out.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Protocol {
    /// Rows double-buffered by parity (else one buffer).
    rows_parity: bool,
    /// Staging double-buffered by parity (else one buffer).
    staging_parity: bool,
    /// The node tickets between the rows and the node's reads.
    tickets: bool,
    /// Signal counters apart for each parity of rows and for cached notifies (else one counter
    /// of every notify, whose target a later put could reach first: puts are not ordered).
    split_signals: bool,
}

const KERNEL: Protocol = Protocol {
    rows_parity: true,
    staging_parity: true,
    tickets: true,
    split_signals: true,
};

/// Who reads a rows slot: its holder as forwarder, or a node member as receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reader {
    Forwarder(usize),
    Receiver(usize),
}

#[derive(Debug, Clone, Default)]
struct Slot {
    /// The notify with rows that wrote it (0: never).
    version: u64,
    owed: BTreeSet<Reader>,
}

/// A put-with-signal in flight: the row (or, cached, the signal alone) from `from` to `to`.
#[derive(Debug, Clone, Copy)]
struct Put {
    from: usize,
    to: usize,
    parity: usize,
    with_rows: u64,
    data: bool,
    /// Which of the destination's signal counters it adds to.
    set: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Block0 {
    WaitRows,
    WaitTickets,
    Done,
}

struct Rank {
    call: usize,
    with_rows: u64,
    sends_left: BTreeSet<usize>,
    block0: Block0,
}

struct Model {
    n: usize,
    g: usize,
    full: Vec<bool>,
    protocol: Protocol,
    ranks: Vec<Rank>,
    rows: Vec<Vec<Vec<Slot>>>,         // [rank][parity][source node]
    staging_busy: Vec<Vec<Vec<bool>>>, // [rank][parity][destination node]
    signals: Vec<Vec<Vec<u64>>>,       // [rank][set][source node]
    tickets: Vec<Vec<u64>>,            // [rank][node member]
    puts: Vec<Put>,
}

impl Model {
    fn new(n: usize, g: usize, full: Vec<bool>, protocol: Protocol) -> Self {
        let nodes = n / g;
        let mut model = Self {
            n,
            g,
            full,
            protocol,
            ranks: Vec::new(),
            rows: vec![vec![vec![Slot::default(); nodes]; 2]; n],
            staging_busy: vec![vec![vec![false; nodes]; 2]; n],
            signals: vec![vec![vec![0; nodes]; 3]; n],
            tickets: vec![vec![0; g]; n],
            puts: Vec::new(),
        };
        model.ranks = (0..n)
            .map(|_| Rank {
                call: 0,
                with_rows: 0,
                sends_left: BTreeSet::new(),
                block0: Block0::Done,
            })
            .collect();
        for r in 0..n {
            model.start(r);
        }
        model
    }

    fn start(&mut self, r: usize) {
        let nodes = self.n / self.g;
        let rank = &mut self.ranks[r];
        if rank.call >= self.full.len() {
            return;
        }
        rank.with_rows += self.full[rank.call] as u64;
        rank.sends_left = (0..nodes).collect();
        rank.block0 = Block0::WaitRows;
    }
    fn k(&self, r: usize) -> u64 {
        self.ranks[r].call as u64 + 1
    }
    fn is_full(&self, r: usize) -> bool {
        self.full[self.ranks[r].call]
    }
    fn parity(&self, with_rows: u64, double: bool) -> usize {
        if double { (with_rows & 1) as usize } else { 0 }
    }
    fn active(&self, r: usize) -> bool {
        self.ranks[r].call < self.full.len()
    }
    /// The signal counter rank r's current notify adds to, and the count it waits for: the
    /// kernel's NotifyCall (rows of parity p: the parity's notifies so far; cached: the cached
    /// notifies so far), or one counter of every notify.
    fn signal(&self, r: usize) -> (usize, u64) {
        let (k, with_rows) = (self.k(r), self.ranks[r].with_rows);
        if !self.protocol.split_signals {
            return (0, k);
        }
        if self.is_full(r) {
            let p = (with_rows & 1) as usize;
            (p, (with_rows + p as u64) / 2)
        } else {
            (2, k - with_rows)
        }
    }

    /// Rows `with_rows` land in rank `x`'s slot [p][b]: nothing may still be owed on it.
    fn write_rows(&mut self, x: usize, p: usize, b: usize, with_rows: u64) -> Result<(), String> {
        let slot = &mut self.rows[x][p][b];
        if !slot.owed.is_empty() {
            return Err(format!(
                "rows {with_rows} from node {b} overwrite rank {x}'s slot [{p}][{b}] (rows {}) \
                 still owed to {:?}",
                slot.version, slot.owed
            ));
        }
        let node = x / self.g * self.g;
        slot.version = with_rows;
        slot.owed = (node..node + self.g).map(Reader::Receiver).collect();
        slot.owed.insert(Reader::Forwarder(x));
        Ok(())
    }

    fn read_rows(
        &mut self,
        x: usize,
        p: usize,
        b: usize,
        reader: Reader,
        with_rows: u64,
    ) -> Result<(), String> {
        let slot = &mut self.rows[x][p][b];
        if slot.version != with_rows || !slot.owed.remove(&reader) {
            return Err(format!(
                "{reader:?} reads rank {x}'s slot [{p}][{b}] for rows {with_rows}: it holds rows \
                 {} (owed to {:?})",
                slot.version, slot.owed
            ));
        }
        Ok(())
    }

    /// Block 1 + k of rank r: its row for node k, sent.
    fn send(&mut self, r: usize, k: usize) -> Result<(), String> {
        self.ranks[r].sends_left.remove(&k);
        let (my_node, with_rows) = (r / self.g, self.ranks[r].with_rows);
        let full = self.is_full(r);
        let rows_parity = self.parity(with_rows, self.protocol.rows_parity);
        if k == my_node {
            if full {
                self.write_rows(r, rows_parity, my_node, with_rows)?;
            }
            let (set, target) = self.signal(r);
            self.signals[r][set][my_node] = target;
            return Ok(());
        }
        if full {
            let sp = self.parity(with_rows, self.protocol.staging_parity);
            if std::mem::replace(&mut self.staging_busy[r][sp][k], true) {
                return Err(format!(
                    "rank {r} stages rows {with_rows} for node {k} over a put still reading"
                ));
            }
        }
        let to = k * self.g + r % self.g;
        self.puts.push(Put {
            from: r,
            to,
            parity: rows_parity,
            with_rows,
            data: full,
            set: self.signal(r).0,
        });
        Ok(())
    }

    fn deliver(&mut self, i: usize) -> Result<(), String> {
        let put = self.puts.swap_remove(i);
        let from_node = put.from / self.g;
        if put.data {
            self.write_rows(put.to, put.parity, from_node, put.with_rows)?;
            let sp = self.parity(put.with_rows, self.protocol.staging_parity);
            self.staging_busy[put.from][sp][put.to / self.g] = false;
        }
        self.signals[put.to][put.set][from_node] += 1;
        Ok(())
    }

    /// Block 0 of rank r, one step if it can make one: Ok(false) when it must wait.
    fn block0(&mut self, r: usize) -> Result<bool, String> {
        let (k, with_rows, full) = (self.k(r), self.ranks[r].with_rows, self.is_full(r));
        let nodes = self.n / self.g;
        let (node, local) = (r / self.g * self.g, r % self.g);
        let p = self.parity(with_rows, self.protocol.rows_parity);
        match self.ranks[r].block0 {
            Block0::WaitRows
                if self.signals[r][self.signal(r).0]
                    .iter()
                    .all(|&s| s >= self.signal(r).1) =>
            {
                if full {
                    for b in 0..nodes {
                        self.read_rows(r, p, b, Reader::Forwarder(r), with_rows)?;
                    }
                }
                for m in node..node + self.g {
                    self.tickets[m][local] = k;
                }
                self.ranks[r].block0 = Block0::WaitTickets;
                Ok(true)
            }
            Block0::WaitTickets
                if !self.protocol.tickets || self.tickets[r].iter().all(|&t| t >= k) =>
            {
                if full {
                    for s in 0..self.n {
                        self.read_rows(
                            node + s % self.g,
                            p,
                            s / self.g,
                            Reader::Receiver(r),
                            with_rows,
                        )?;
                    }
                }
                self.ranks[r].block0 = Block0::Done;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// One random step; Ok(false) once every rank made every call and every put landed.
    fn step(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let mut moves: Vec<(usize, usize)> = Vec::new(); // (kind, index)
        for r in (0..self.n).filter(|&r| self.active(r)) {
            moves.extend(self.ranks[r].sends_left.iter().map(|&k| (0, r * 64 + k)));
            moves.push((1, r));
            if self.ranks[r].sends_left.is_empty() && self.ranks[r].block0 == Block0::Done {
                moves.push((2, r));
            }
        }
        moves.extend((0..self.puts.len()).map(|i| (3, i)));
        if moves.is_empty() {
            return Ok(false);
        }
        // Try moves in random order until one can be made (block 0 may have to wait).
        while !moves.is_empty() {
            let (kind, i) = moves.swap_remove(rng.random_range(0..moves.len()));
            match kind {
                0 => return self.send(i / 64, i % 64).map(|_| true),
                1 if self.block0(i)? => return Ok(true),
                2 => {
                    self.ranks[i].call += 1; // the kernel ended: the stream starts the next call
                    self.start(i);
                    return Ok(true);
                }
                3 => return self.deliver(i).map(|_| true),
                _ => {}
            }
        }
        Err("deadlock: every rank waits and no put is in flight".into())
    }
}

/// Runs `schedules` random interleavings of `calls` (true: full) on n ranks in nodes of g;
/// the first violation, if any.
fn run(
    n: usize,
    g: usize,
    calls: &[bool],
    protocol: Protocol,
    schedules: u64,
) -> Result<(), String> {
    for seed in 0..schedules {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model = Model::new(n, g, calls.to_vec(), protocol);
        while model
            .step(&mut rng)
            .map_err(|e| format!("seed {seed}: {e}"))?
        {}
    }
    Ok(())
}

#[test]
fn rows_and_staging_are_never_overwritten_while_owed() {
    let mixes: [&[bool]; 3] = [
        &[true; 8],
        &[true, false, true, true, false, false, true, true],
        &[false, true, false, true, true, false, true, false],
    ];
    for (n, g) in [(4, 2), (4, 1), (6, 3), (8, 2)] {
        for calls in mixes {
            run(n, g, calls, KERNEL, 300)
                .unwrap_or_else(|e| panic!("{n} in nodes of {g}, {calls:?}: {e}"));
        }
    }
}

#[test]
fn the_model_fails_without_each_part_of_the_protocol() {
    let calls = [true; 8];
    let mutations = [
        (
            "one rows buffer",
            Protocol {
                rows_parity: false,
                ..KERNEL
            },
        ),
        (
            "one staging buffer",
            Protocol {
                staging_parity: false,
                ..KERNEL
            },
        ),
        (
            "no node tickets",
            Protocol {
                tickets: false,
                ..KERNEL
            },
        ),
    ];
    for (what, protocol) in mutations {
        let failed = [(4, 2), (8, 2), (6, 3)]
            .iter()
            .any(|&(n, g)| run(n, g, &calls, protocol, 300).is_err());
        assert!(failed, "{what}: no schedule of the model found the hazard");
    }
}
