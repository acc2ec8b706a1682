//! The checkers that run after every step.

use braid_vsr::{Refusal, ReplicaId};

use super::*;

impl Simulation {
    #[allow(clippy::too_many_arguments)] // the fields of Output::Applied
    pub(crate) fn on_applied(
        &mut self,
        group: u64,
        replica: ReplicaId,
        op: u64,
        checksum: braid_vsr::Checksum,
        session: u64,
        request: u64,
        executed: bool,
        result: Result<Vec<u8>, Refusal>,
    ) {
        if self.trace {
            eprintln!(
                "t{} g{group}r{replica} applied op {op} {checksum:x}",
                self.tick
            );
        }
        let Some(model) = self.models.get_mut(&group) else {
            return;
        };
        match model.committed.get(&op) {
            Some(existing) if *existing != checksum => {
                let existing = *existing;
                let chain: Vec<String> = self
                    .servers
                    .iter()
                    .filter_map(|(r, server)| server.replica(group).map(|x| (r, x)))
                    .map(|(r, x)| {
                        let ops: Vec<String> = (op.saturating_sub(1)..=op + 3)
                            .map(|o| match x.header(o) {
                                Some(h) => format!(
                                    "{o}:{:x}<-{:x}@v{}{}",
                                    h.checksum >> 112,
                                    h.parent >> 112,
                                    h.view,
                                    if x.entry_state(o).is_some_and(|e| e.2) {
                                        "*"
                                    } else {
                                        ""
                                    }
                                ),
                                None => format!("{o}:-"),
                            })
                            .collect();
                        format!("r{r} [{}]", ops.join(" "))
                    })
                    .collect();
                let what = format!(
                    "g{group}r{replica} applied op {op} with checksum {checksum:x}, others {existing:x}; chains {}",
                    chain.join("; ")
                );
                self.fail(what);
                return;
            }
            Some(_) => {
                // Another replica's application of a known op: results must agree.
                if executed
                    && request > 0
                    && model.results.get(&(session, request)) != Some(&result)
                {
                    let what = format!("g{group}r{replica} op {op}: result {result:?} differs from the first application");
                    self.fail(what);
                }
                return;
            }
            None => {}
        }
        let expected_op = model.committed.keys().next_back().map_or(1, |o| o + 1);
        if op != expected_op {
            let what = format!(
                "g{group}r{replica} applied op {op} before op {expected_op} was committed anywhere"
            );
            self.fail(what);
            return;
        }
        model.committed.insert(op, checksum);
        if !executed || request == 0 {
            return;
        }
        if model.results.contains_key(&(session, request)) {
            let what =
                format!("g{group}: request {request} of session {session} applied twice (op {op})");
            self.fail(what);
            return;
        }
        if let Some(operation) = model.operations.get(&(session, request)).copied() {
            if let Some(first) = model.executed.insert(operation, (session, request)) {
                let what = format!(
                    "g{group}: operation {} of client {} ran twice, as request {} of session {} and as request {request} of session {session} (op {op})",
                    operation.1, operation.0, first.1, first.0
                );
                self.fail(what);
                return;
            }
        }
        let Some(body) = model.bodies.get(&(session, request)).cloned() else {
            let what =
                format!("g{group}: op {op} applied a request nobody sent ({session}, {request})");
            self.fail(what);
            return;
        };
        let expected = braid_vsr::StateMachine::apply(&mut model.machine, op, &body);
        if result.as_ref() != Ok(&expected) {
            let what = format!(
                "g{group} op {op}: result {result:?}, the model says {:?}",
                String::from_utf8_lossy(&expected)
            );
            self.fail(what);
            return;
        }
        model.results.insert((session, request), result);
    }

    /// The log-level check: every replica that ever holds (view, op) holds one checksum
    /// for it. A primary that prepared two different ops at one number in one view is
    /// caught here, at prepare time, before any replica applies either.
    pub(crate) fn check_prepared(&mut self, key: (u64, ReplicaId), header: &braid_vsr::Header) {
        let (group, replica) = key;
        let slot = (group, header.view, header.op);
        match self.prepared.get(&slot) {
            Some(existing) if *existing != header.checksum => {
                let what = format!(
                    "g{group}r{replica} holds op {} of view {} with checksum {:x}, another replica {existing:x}",
                    header.op, header.view, header.checksum
                );
                self.fail(what);
            }
            Some(_) => {}
            None => {
                self.prepared.insert(slot, header.checksum);
            }
        }
    }

    pub(crate) fn check(&mut self) {
        let mut failures = Vec::new();
        let views: BTreeMap<(u64, ReplicaId), u64> = self
            .nodes
            .keys()
            .filter_map(|key| self.replica_at(*key).map(|r| (*key, r.view())))
            .collect();
        for ((group, replica), node) in self.nodes.iter_mut() {
            let durable = node.disk.durable_state();
            if durable.view < node.max_durable_view {
                failures.push(format!(
                    "g{group}r{replica}: durable view went backwards ({} < {})",
                    durable.view, node.max_durable_view
                ));
            }
            node.max_durable_view = node.max_durable_view.max(durable.view);
            if durable.commit < node.max_durable_commit {
                failures.push(format!(
                    "g{group}r{replica}: durable commit went backwards ({} < {})",
                    durable.commit, node.max_durable_commit
                ));
            }
            node.max_durable_commit = durable.commit;
            if let Some(view) = views.get(&(*group, *replica)).copied() {
                if view < node.max_view {
                    failures.push(format!(
                        "g{group}r{replica}: view went backwards ({view} < {})",
                        node.max_view
                    ));
                }
                node.max_view = node.max_view.max(view);
                if view < durable.view {
                    failures.push(format!(
                        "g{group}r{replica}: running below its durable view"
                    ));
                }
            }
        }
        for what in failures {
            self.fail(what);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24, finding 14: the check compared the durable view with the smaller of
    /// itself and the highest view, so it could never fire. A disk whose durable state
    /// goes back to an older view (as a damaged newest copy taken silently would) now
    /// fails the run.
    #[test]
    fn a_durable_view_that_goes_back_fails_the_run() {
        let config = SimConfig {
            replica_count: 3,
            ..SimConfig::from_seed(7)
        };
        let mut sim = Simulation::new(config);
        let key = *sim.nodes.keys().next().unwrap();
        let node = sim.nodes.get_mut(&key).unwrap();
        node.disk.rewrite_state(braid_vsr::DurableState {
            view: 5,
            log_view: 5,
            ..braid_vsr::DurableState::default()
        });
        sim.check();
        // (Its replica, still in view 0, runs below that durable view: another check.)
        let first = sim.failure.take();
        assert!(
            !format!("{first:?}").contains("went backwards"),
            "{first:?}"
        );
        let node = sim.nodes.get_mut(&key).unwrap();
        node.disk.rewrite_state(braid_vsr::DurableState {
            view: 3,
            log_view: 3,
            ..braid_vsr::DurableState::default()
        });
        sim.check();
        let failure = sim.failure.take().expect("the step back is seen");
        assert!(format!("{failure:?}").contains("durable view went backwards"));
    }
}
