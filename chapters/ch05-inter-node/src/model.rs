//! A host model of the plans, for the CPU tests: every PE's buffers as bytes, every step
//! applied to its whole group as its kernel (or NVSHMEM's team call) defines it, the groups
//! scheduled the way the GPUs meet them: a node or rail step runs once every member of the
//! group has reached the same step. A plan whose members disagree, or that deadlocks, panics.
//! The all-to-all-v steps follow the kernels' row layout (landing slots by source node, each
//! PE's rows found by skipping its node predecessors'), so the tests check that layout too.

use std::collections::HashMap;

use crate::layout::Layout;
use crate::plan::{Buf, Scope, Step};
use crate::reference::Element;

/// Every PE's buffers and, for all-to-all-v, what travels beside the rows.
pub struct Model {
    layout: Layout,
    buffers: Vec<HashMap<Buf, Vec<u8>>>,
    /// splits[p][q]: rows PE p sends PE q (all-to-all-v).
    splits: Vec<Vec<usize>>,
    /// Per PE: the rail group's landing slots, by source node, and counts rows, by source node.
    slots: Vec<Vec<Vec<u8>>>,
    rail_counts: Vec<Vec<Vec<usize>>>,
    /// Per PE: (rows from each PE, where they start) after an all-to-all-v.
    pub received: Vec<(Vec<i64>, Vec<i64>)>,
}

impl Model {
    /// PE p's Input is `inputs[p]`; Out is `out_bytes` of poison (0xFF); the stages hold
    /// `stage_bytes` of garbage (0xEE).
    pub fn new(layout: Layout, inputs: Vec<Vec<u8>>, out_bytes: usize, stage_bytes: usize) -> Self {
        let n = layout.n_pes;
        let buffers = inputs
            .into_iter()
            .map(|input| {
                HashMap::from([
                    (Buf::Input, input),
                    (Buf::Out, vec![0xFF; out_bytes]),
                    (Buf::StageA, vec![0xEE; stage_bytes]),
                    (Buf::StageB, vec![0xEE; stage_bytes]),
                ])
            })
            .collect();
        Self {
            layout,
            buffers,
            splits: vec![vec![0; n]; n],
            slots: vec![vec![Vec::new(); layout.num_nodes()]; n],
            rail_counts: vec![vec![Vec::new(); layout.num_nodes()]; n],
            received: vec![(Vec::new(), Vec::new()); n],
        }
    }

    pub fn with_splits(mut self, splits: Vec<Vec<usize>>) -> Self {
        self.splits = splits;
        self
    }

    pub fn buffer(&self, pe: usize, buf: Buf) -> &[u8] {
        &self.buffers[pe][&buf]
    }

    // ANCHOR: model_run
    /// Runs PE p's `plans[p]`, every group step once all its members reached it.
    pub fn run<T: Element>(&mut self, plans: &[Vec<Step>]) {
        let n = self.layout.n_pes;
        let mut next = vec![0usize; n];
        while next.iter().zip(plans).any(|(&i, plan)| i < plan.len()) {
            let mut progressed = false;
            for pe in 0..n {
                while let Some(step) = plans[pe]
                    .get(next[pe])
                    .filter(|s| s.scope() == Scope::Local)
                {
                    self.local(pe, step);
                    next[pe] += 1;
                    progressed = true;
                }
                let Some(step) = plans[pe].get(next[pe]) else {
                    continue;
                };
                let group = self.group(pe, step.scope());
                if group.iter().all(|&q| plans[q].get(next[q]) == Some(step)) {
                    self.collective::<T>(step, &group);
                    group.iter().for_each(|&q| next[q] += 1);
                    progressed = true;
                }
            }
            assert!(
                progressed,
                "the plans deadlock or their groups disagree at steps {next:?}"
            );
        }
    }
    // ANCHOR_END: model_run

    fn group(&self, pe: usize, scope: Scope) -> Vec<usize> {
        match scope {
            Scope::Node => self.layout.node_team(self.layout.node_of(pe)).members(),
            Scope::Rail => self.layout.rail_team(self.layout.local_of(pe)).members(),
            Scope::Local => vec![pe],
        }
    }

    fn read(&self, pe: usize, buf: Buf, offset: usize, len: usize) -> Vec<u8> {
        self.buffers[pe][&buf][offset..offset + len].to_vec()
    }

    fn write(&mut self, pe: usize, buf: Buf, offset: usize, bytes: &[u8]) {
        let target = self.buffers.get_mut(pe).unwrap().get_mut(&buf).unwrap();
        target[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn local(&mut self, pe: usize, step: &Step) {
        match *step {
            Step::Permute {
                out,
                input,
                outer,
                inner,
                block_bytes: b,
            } => {
                for (i, j) in (0..outer).flat_map(|i| (0..inner).map(move |j| (i, j))) {
                    let block = self.read(pe, input, (i * inner + j) * b, b);
                    self.write(pe, out, (j * outer + i) * b, &block);
                }
            }
            Step::Copy {
                out,
                input,
                num_bytes,
            } => {
                let bytes = self.read(pe, input, 0, num_bytes);
                self.write(pe, out, 0, &bytes);
            }
            Step::Zero {
                buf,
                offset,
                num_bytes,
            } => self.write(pe, buf, offset, &vec![0; num_bytes]),
            _ => unreachable!("not a local step: {step:?}"),
        }
    }

    /// The group's sum, element by element in group order, of `count` elements at element
    /// `first` of each member's `input`: fp32, rounded once, as the kernels sum.
    fn sum<T: Element>(&self, group: &[usize], input: Buf, first: usize, count: usize) -> Vec<u8> {
        let z = T::SIZE;
        let values: Vec<Vec<T>> = group
            .iter()
            .map(|&p| T::from_bytes(&self.read(p, input, first * z, count * z)))
            .collect();
        T::to_bytes(&ch04_collectives::reference::sum(&values, 0, count))
    }

    fn collective<T: Element>(&mut self, step: &Step, group: &[usize]) {
        use Step::*;
        let writes: Vec<(usize, Buf, usize, Vec<u8>)> = match *step {
            NodeReduceScatter { out, input, count } | RailReduceScatter { out, input, count } => {
                group
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| (p, out, 0, self.sum::<T>(group, input, i * count, count)))
                    .collect()
            }
            NodeAllReduce { out, input, count } | RailAllReduce { out, input, count } => {
                let sum = self.sum::<T>(group, input, 0, count);
                group.iter().map(|&p| (p, out, 0, sum.clone())).collect()
            }
            NodeAllGather {
                out,
                input,
                num_bytes,
            }
            | RailAllGather {
                out,
                input,
                num_bytes,
            } => {
                let all: Vec<u8> = group
                    .iter()
                    .flat_map(|&p| self.read(p, input, 0, num_bytes))
                    .collect();
                group.iter().map(|&p| (p, out, 0, all.clone())).collect()
            }
            NodeBroadcast {
                out,
                input,
                num_bytes,
                root,
            }
            | RailBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => {
                let data = self.read(group[root], input, 0, num_bytes);
                group.iter().map(|&p| (p, out, 0, data.clone())).collect()
            }
            A2avSend {
                input, row_bytes, ..
            } => {
                self.a2av_send(group, input, row_bytes);
                vec![]
            }
            A2avForward { out, row_bytes, .. } => self.a2av_forward(group, out, row_bytes),
            NodeAllToAllV {
                out,
                input,
                row_bytes,
                ..
            }
            | RailAllToAllV {
                out,
                input,
                row_bytes,
                ..
            } => self.a2av_direct(group, out, input, row_bytes),
            Permute { .. } | Copy { .. } | Zero { .. } => unreachable!("local step {step:?}"),
        };
        for (pe, buf, offset, bytes) in writes {
            self.write(pe, buf, offset, &bytes);
        }
    }

    /// Rail member k's rows for node k2 (PEs k2 x G ..) land in slot k on member k2, with
    /// member k's row of counts.
    fn a2av_send(&mut self, rail: &[usize], input: Buf, row_bytes: usize) {
        let g = self.layout.node_pes;
        for (k, &p) in rail.iter().enumerate() {
            for (k2, &r) in rail.iter().enumerate() {
                let first: usize = self.splits[p][..k2 * g].iter().sum();
                let rows: usize = self.splits[p][k2 * g..(k2 + 1) * g].iter().sum();
                self.slots[r][k] = self.read(p, input, first * row_bytes, rows * row_bytes);
                self.rail_counts[r][k] = self.splits[p].clone();
            }
        }
    }

    /// Every PE d of the node pulls, for every source PE s = (k, l) in PE order, its rows
    /// out of slot k of the node's forwarder l, after the rows of the node's PEs before d.
    fn a2av_forward(
        &mut self,
        node: &[usize],
        out: Buf,
        row_bytes: usize,
    ) -> Vec<(usize, Buf, usize, Vec<u8>)> {
        let layout = self.layout;
        let mut writes = Vec::new();
        for &d in node {
            let (mut rows_out, mut counts, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
            for s in 0..layout.n_pes {
                let forwarder = layout.pe(layout.node_of(d), layout.local_of(s));
                let row = &self.rail_counts[forwarder][layout.node_of(s)];
                let skip: usize = row[layout.pe(layout.node_of(d), 0)..d].iter().sum();
                let slot = &self.slots[forwarder][layout.node_of(s)];
                offsets.push((rows_out.len() / row_bytes) as i64);
                counts.push(row[d] as i64);
                rows_out.extend_from_slice(&slot[skip * row_bytes..(skip + row[d]) * row_bytes]);
            }
            self.received[d] = (counts, offsets);
            writes.push((d, out, 0, rows_out));
        }
        writes
    }

    /// All-to-all-v within one group (a single node, or nodes of one PE): rows straight from
    /// every member, in member order.
    fn a2av_direct(
        &mut self,
        group: &[usize],
        out: Buf,
        input: Buf,
        row_bytes: usize,
    ) -> Vec<(usize, Buf, usize, Vec<u8>)> {
        let mut writes = Vec::new();
        for &d in group {
            let (mut rows_out, mut counts, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
            for &s in group {
                let first: usize = self.splits[s][..d].iter().sum();
                offsets.push((rows_out.len() / row_bytes) as i64);
                counts.push(self.splits[s][d] as i64);
                rows_out.extend(self.read(
                    s,
                    input,
                    first * row_bytes,
                    self.splits[s][d] * row_bytes,
                ));
            }
            self.received[d] = (counts, offsets);
            writes.push((d, out, 0, rows_out));
        }
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan;
    use crate::reference::{hier_all_reduce, hier_reduce_scatter};
    use ch04_collectives::reference::{self as flat, pattern_byte, pattern_value};

    /// Job sizes and node sizes: one node, nodes of one PE, and everything between.
    const LAYOUTS: &[(usize, usize)] = &[
        (1, 1),
        (2, 1),
        (2, 2),
        (4, 1),
        (4, 2),
        (4, 4),
        (6, 3),
        (8, 1),
        (8, 2),
        (8, 4),
        (12, 4),
        (16, 8),
    ];
    const STAGE: usize = 1 << 20;

    fn layouts() -> impl Iterator<Item = Layout> {
        LAYOUTS.iter().map(|&(n, g)| Layout::new(n, g).unwrap())
    }

    fn values<T: Element>(n: usize, len: usize, seed: u32) -> Vec<Vec<T>> {
        (0..n)
            .map(|p| {
                (0..len)
                    .map(|i| T::from_f32(pattern_value(p, i, seed)))
                    .collect()
            })
            .collect()
    }

    /// Runs one plan per PE on `inputs`; returns every PE's Out.
    fn run<T: Element>(
        layout: Layout,
        plans: Vec<plan::Plan>,
        inputs: Vec<Vec<u8>>,
        out_bytes: usize,
    ) -> Model {
        let steps: Vec<Vec<Step>> = plans.into_iter().map(|p| p.steps).collect();
        let mut model = Model::new(layout, inputs, out_bytes, STAGE);
        model.run::<T>(&steps);
        model
    }

    fn check_out(model: &Model, pe: usize, expected: &[u8], what: &str) {
        let out = model.buffer(pe, Buf::Out);
        assert_eq!(&out[..expected.len()], expected, "{what}: pe {pe}");
        assert!(
            out[expected.len()..].iter().all(|&b| b == 0xFF),
            "{what}: pe {pe} wrote past its output"
        );
    }

    fn check_reductions<T: Element>(layout: Layout, count: usize) {
        let n = layout.n_pes;
        let what = format!("{} {count} x {}", layout.describe(), T::DTYPE.name());
        // All-reduce: the hierarchical sum of every element.
        let inputs = values::<T>(n, count, 7);
        let plans = (0..n)
            .map(|_| plan::all_reduce(&layout, count, T::SIZE))
            .collect();
        let model = run::<T>(
            layout,
            plans,
            inputs.iter().map(|v| T::to_bytes(v)).collect(),
            4 * count * T::SIZE,
        );
        let expected = T::to_bytes(&hier_all_reduce(&inputs, &layout, count));
        (0..n).for_each(|pe| check_out(&model, pe, &expected, &format!("all_reduce {what}")));
        // Reduce-scatter: chunk me of the hierarchical sum.
        let inputs = values::<T>(n, n * count, 9);
        let plans = (0..n)
            .map(|_| plan::reduce_scatter(&layout, count, T::SIZE))
            .collect();
        let model = run::<T>(
            layout,
            plans,
            inputs.iter().map(|v| T::to_bytes(v)).collect(),
            2 * count * T::SIZE,
        );
        for pe in 0..n {
            let expected = T::to_bytes(&hier_reduce_scatter(&inputs, &layout, pe, count));
            check_out(&model, pe, &expected, &format!("reduce_scatter {what}"));
        }
    }

    #[test]
    fn every_hierarchical_reduction_matches_the_hierarchical_reference() {
        for layout in layouts() {
            for count in [1, 3, 13, 1000, 1001] {
                check_reductions::<f32>(layout, count);
                check_reductions::<half::bf16>(layout, count);
            }
        }
    }

    #[test]
    fn every_hierarchical_all_gather_and_broadcast_matches_the_reference() {
        for layout in layouts() {
            let n = layout.n_pes;
            for num_bytes in [1, 7, 100] {
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|p| (0..num_bytes).map(|i| pattern_byte(p, i, 3)).collect())
                    .collect();
                let plans = (0..n)
                    .map(|_| plan::all_gather(&layout, num_bytes))
                    .collect();
                let model = run::<f32>(layout, plans, inputs.clone(), n * num_bytes + 5);
                let expected = flat::all_gather(&inputs);
                (0..n).for_each(|pe| {
                    check_out(&model, pe, &expected, &format!("all_gather {layout:?}"))
                });
                for root in (0..n).step_by(n.div_ceil(3)) {
                    let plans = (0..n)
                        .map(|me| plan::broadcast(&layout, me, num_bytes, root))
                        .collect();
                    let model = run::<f32>(layout, plans, inputs.clone(), num_bytes + 5);
                    let expected = flat::broadcast(&inputs, root);
                    (0..n).for_each(|pe| {
                        check_out(
                            &model,
                            pe,
                            &expected,
                            &format!("broadcast {root} {layout:?}"),
                        )
                    });
                }
            }
        }
    }

    #[test]
    fn the_hierarchical_all_to_all_v_delivers_rows_grouped_by_source_pe() {
        for layout in layouts() {
            let n = layout.n_pes;
            let row_bytes = 3;
            for shape in ["random", "all to the last pe", "none"] {
                let rows = |p: usize, q: usize| match shape {
                    "random" => (kernels::pattern_word(p, q as u64, 5) % 4) as usize,
                    "all to the last pe" => usize::from(q == n - 1) * (p + 1),
                    _ => 0,
                };
                let splits: Vec<Vec<usize>> = (0..n)
                    .map(|p| (0..n).map(|q| rows(p, q)).collect())
                    .collect();
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|p| {
                        (0..splits[p].iter().sum::<usize>() * row_bytes)
                            .map(|i| pattern_byte(p, i, 1))
                            .collect()
                    })
                    .collect();
                let out_rows = 4 * n * n;
                let steps: Vec<Vec<Step>> = (0..n)
                    .map(|_| plan::all_to_all_v(&layout, row_bytes, 4 * n, out_rows).steps)
                    .collect();
                let mut model = Model::new(layout, inputs.clone(), out_rows * row_bytes, STAGE)
                    .with_splits(splits.clone());
                model.run::<f32>(&steps);
                for pe in 0..n {
                    let (rows_in, counts, offsets) =
                        flat::all_to_all_v(&inputs, &splits, pe, row_bytes);
                    check_out(
                        &model,
                        pe,
                        &rows_in,
                        &format!("all_to_all_v {shape} {layout:?}"),
                    );
                    assert_eq!(
                        model.received[pe],
                        (counts, offsets),
                        "{shape} {layout:?} pe {pe}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_members_of_every_node_and_rail_make_the_same_calls() {
        // Model::run panics when a group's members disagree or deadlock; broadcast is the
        // plan whose steps differ between PEs (only the root's rail crosses nodes).
        for layout in layouts() {
            for root in 0..layout.n_pes {
                let plans: Vec<Vec<Step>> = (0..layout.n_pes)
                    .map(|me| plan::broadcast(&layout, me, 16, root).steps)
                    .collect();
                let inputs = vec![vec![1u8; 16]; layout.n_pes];
                Model::new(layout, inputs, 16, STAGE).run::<f32>(&plans);
            }
        }
    }
}
