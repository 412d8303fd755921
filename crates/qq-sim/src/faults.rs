//! The faults of a plan on a running simulated cluster: which are under way, what each link
//! looks like because of them ([`link`], pure), and striking and healing them.
//!
//! Up to two faults are under way at once (the plan's bound). A link's state is always made
//! afresh from the run's weather and every fault under way, so faults compose (a delay on a
//! node that is also cut off from one peer) and healing one leaves the other in place. A node
//! crashed by two faults at once starts again when the last of them heals.

use std::time::Duration;

use crate::host::Host;
use crate::net::{Link, SimNet};
use crate::schedule::Fault;

/// A fault under way, on the node its target named when it struck (0 for a bridge).
#[derive(Clone, Debug)]
pub struct Active {
    pub fault: Fault,
    pub node: u64,
    /// When it heals, as time into the run.
    pub until: Duration,
}

/// What the link `from -> to` is with `active` faults over the run's `weather`.
pub fn link(weather: Link, active: &[Active], from: u64, to: u64) -> Link {
    let mut l = weather;
    for a in active {
        let touches = from == a.node || to == a.node;
        match a.fault {
            Fault::Isolate { .. } if touches => l.blocked = true,
            Fault::MuteOutgoing { .. } if from == a.node => l.blocked = true,
            Fault::DeafIncoming { .. } if to == a.node => l.blocked = true,
            Fault::Bridge { a, b } if (from, to) == (a, b) || (from, to) == (b, a) => {
                l.blocked = true
            }
            Fault::Delay {
                delay_ms,
                jitter_ms,
                ..
            } if touches => {
                l.delay_ms += delay_ms;
                l.jitter_ms += jitter_ms;
            }
            Fault::Loss { loss_pct, .. } if touches => l.loss_pct = l.loss_pct.max(loss_pct),
            _ => {}
        }
    }
    l
}

/// The nodes of one run, their network, and the faults under way.
pub struct Cluster {
    pub net: SimNet,
    pub hosts: Vec<Host>,
    weather: Link,
    active: Vec<Active>,
}

impl Cluster {
    pub fn new(net: SimNet, hosts: Vec<Host>, weather: Link) -> Cluster {
        let cluster = Cluster {
            net,
            hosts,
            weather,
            active: Vec::new(),
        };
        cluster.apply_links();
        cluster
    }

    pub fn ids(&self) -> Vec<u64> {
        self.hosts.iter().map(|h| h.id).collect()
    }

    fn host(&mut self, id: u64) -> &mut Host {
        self.hosts
            .iter_mut()
            .find(|h| h.id == id)
            .expect("a node of the cluster")
    }

    /// Every node's wall clock jumped by the clock jumps under way on it (summed).
    fn apply_jumps(&mut self) {
        for id in self.ids() {
            let jump = self
                .active
                .iter()
                .filter(|a| a.node == id)
                .map(|a| match a.fault {
                    Fault::ClockJump { jump_ms, .. } => jump_ms,
                    _ => 0,
                })
                .sum();
            self.host(id).set_jump(jump);
        }
    }

    /// Every link as the weather and the faults under way make it.
    fn apply_links(&self) {
        for from in self.ids() {
            for to in self.ids() {
                if from != to {
                    self.net
                        .set_link(from, to, link(self.weather, &self.active, from, to));
                }
            }
        }
    }

    /// Strikes `fault` on `node` from `now` until `until` (times into the run); returns what
    /// it did, for the trace.
    pub fn strike(&mut self, fault: Fault, node: u64, now: Duration, until: Duration) -> String {
        let length = until.saturating_sub(now);
        let what = match fault {
            Fault::Reset { .. } => {
                let cut: usize = self
                    .ids()
                    .into_iter()
                    .filter(|o| *o != node)
                    .map(|o| self.net.cut(node, o))
                    .sum();
                format!("{cut} connections reset")
            }
            Fault::Crash { .. } => {
                let host = self.host(node);
                if host.is_running() {
                    // Ending a node joins its thread: not on a worker the clients need.
                    match tokio::task::block_in_place(|| host.crash()) {
                        Ok(cut) => format!(
                            "crashed; {} unsynced WAL bytes lost from {} files",
                            cut.bytes, cut.files
                        ),
                        Err(e) => format!("crashed ({e:#})"),
                    }
                } else {
                    "already down".to_string()
                }
            }
            Fault::Pause { .. } => {
                self.host(node).pause(length);
                "paused".to_string()
            }
            Fault::ClockJump { jump_ms, .. } => format!("wall clock {jump_ms:+} ms"),
            _ => "links changed".to_string(),
        };
        self.active.push(Active { fault, node, until });
        self.apply_links();
        self.apply_jumps();
        what
    }

    /// Heals every fault whose time is up at `now`; returns them.
    pub fn heal_due(&mut self, now: Duration) -> anyhow::Result<Vec<Active>> {
        let (due, kept): (Vec<Active>, Vec<Active>) =
            self.active.drain(..).partition(|a| a.until <= now);
        self.active = kept;
        self.apply_links();
        self.apply_jumps();
        for a in &due {
            self.restart_if_crashed(a)?;
        }
        Ok(due)
    }

    /// Heals everything: every link back to the weather, every node running.
    pub fn heal_all(&mut self) -> anyhow::Result<()> {
        self.active.clear();
        self.apply_links();
        self.apply_jumps();
        let net = self.net.clone();
        for h in &mut self.hosts {
            if !h.is_running() {
                h.start(&net)?;
            }
        }
        Ok(())
    }

    /// Starts the node `a` crashed, unless another crash under way holds it down.
    fn restart_if_crashed(&mut self, a: &Active) -> anyhow::Result<()> {
        if !matches!(a.fault, Fault::Crash { .. }) {
            return Ok(());
        }
        let held = self
            .active
            .iter()
            .any(|o| o.node == a.node && matches!(o.fault, Fault::Crash { .. }));
        let net = self.net.clone();
        let host = self.host(a.node);
        if !held && !host.is_running() {
            host.start(&net)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Target;

    fn active(fault: Fault, node: u64) -> Active {
        Active {
            fault,
            node,
            until: Duration::from_secs(1),
        }
    }

    const T: Target = Target::Node(0);

    #[test]
    fn one_way_faults_block_one_direction() {
        let w = Link::default();
        let mute = [active(Fault::MuteOutgoing { target: T }, 2)];
        assert!(link(w, &mute, 2, 1).blocked);
        assert!(!link(w, &mute, 1, 2).blocked);
        let deaf = [active(Fault::DeafIncoming { target: T }, 2)];
        assert!(link(w, &deaf, 1, 2).blocked);
        assert!(!link(w, &deaf, 2, 1).blocked);
        let isolate = [active(Fault::Isolate { target: T }, 3)];
        assert!(link(w, &isolate, 3, 1).blocked && link(w, &isolate, 2, 3).blocked);
        assert!(!link(w, &isolate, 1, 2).blocked);
    }

    #[test]
    fn a_bridge_cuts_only_its_pair() {
        let bridge = [active(Fault::Bridge { a: 1, b: 3 }, 0)];
        let w = Link::default();
        assert!(link(w, &bridge, 1, 3).blocked && link(w, &bridge, 3, 1).blocked);
        assert!(!link(w, &bridge, 1, 2).blocked && !link(w, &bridge, 2, 3).blocked);
    }

    #[test]
    fn faults_compose_over_the_weather_and_heal_one_at_a_time() {
        let w = Link {
            delay_ms: 2,
            jitter_ms: 1,
            ..Link::default()
        };
        let delay = active(
            Fault::Delay {
                target: T,
                delay_ms: 100,
                jitter_ms: 10,
            },
            1,
        );
        let loss = active(
            Fault::Loss {
                target: T,
                loss_pct: 20,
            },
            1,
        );
        let cut = active(Fault::Bridge { a: 1, b: 2 }, 0);
        let all = [delay.clone(), loss, cut];
        let l = link(w, &all, 1, 2);
        assert_eq!(
            (l.blocked, l.delay_ms, l.jitter_ms, l.loss_pct),
            (true, 102, 11, 20)
        );
        assert_eq!(
            link(w, &all, 2, 3),
            w,
            "a link no fault touches keeps the weather"
        );
        let l = link(w, &[delay], 2, 1);
        assert_eq!((l.blocked, l.delay_ms, l.loss_pct), (false, 102, 0));
        assert_eq!(link(w, &[], 1, 2), w);
    }
}
