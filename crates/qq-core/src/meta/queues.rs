//! The queue handlers of [`MetaState::apply`]: declare (placement, equivalence of a
//! redeclare), members and delete.

use super::*;

impl MetaState {
    // The fields of MetaCommand::DeclareQueue, passed through one by one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn declare_queue(
        &mut self,
        vhost: &str,
        name: &str,
        arguments: Table,
        passive: bool,
        placement: Placement,
        owner: Option<String>,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let Placement { mut nodes, origin } = placement;
        nodes.sort_unstable();
        nodes.dedup();
        // Both scan every queue: only when they decide something (a declare with neither a
        // balanced locator nor a user limit must not cost time linear in the queues).
        let balanced = self.vhosts.get(vhost).is_some_and(|v| {
            let matching = policy::matching_policy(v.policies.values(), name);
            leader_locator(&arguments, matching) == Some("balanced")
        });
        let least_leading = if balanced {
            self.least_leading(&nodes)
        } else {
            0
        };
        let next_id = self.next_queue_id;
        let self_version = self.machine_version;
        let owned = owner
            .as_deref()
            .filter(|u| self.user_limits.contains_key(*u))
            .map_or(0, |u| {
                self.count_owned(u, |v| v.queues.values().map(|q| &q.owner))
            });
        let user_limits = owner.as_deref().map(|u| self.user_limits(u));
        let vhost_limits = self.vhost_limits(vhost);
        let v = self.vhost_mut(vhost)?;
        if passive {
            return match v.queues.get(name) {
                Some(q) => Ok(MetaReply::QueueDeclared {
                    queue: q.clone(),
                    created: false,
                }),
                None => Err(queue_not_found(vhost, name)),
            };
        }
        check_name("queue", name)?;
        if let Some(current) = v.queues.get(name) {
            check_equivalent(vhost, name, &current.arguments, &arguments)?;
            return Ok(MetaReply::QueueDeclared {
                queue: current.clone(),
                created: false,
            });
        }
        check_not_reserved("queue", name)?;
        policy::validate_queue_arguments(&arguments)?;
        // Release 0.1.0 refused the argument: a log that runs its machine still does.
        if arguments.contains_key("x-max-priority") && self_version < 2 {
            return Err(MetaError::invalid(
                "x-max-priority: not supported by quorum queues until metadata machine \
                 version 2 (every node must run a release that has strict priorities)",
            ));
        }
        vhost_limits
            .admit(Counted::Queues, Scope::Vhost(vhost), v.queues.len() as u64)
            .map_err(|e| declare_refused(name, e))?;
        if let (Some(u), Some(limits)) = (owner.as_deref(), user_limits) {
            limits
                .admit(Counted::Queues, Scope::User(u), owned)
                .map_err(|e| declare_refused(name, e))?;
        }
        let matching = policy::matching_policy(v.policies.values(), name);
        let config = v.queue_config(vhost, name, &arguments);
        policy::check_declared_strategy(&arguments, &config)?;
        let locator = leader_locator(&arguments, matching).map(str::to_string);

        if nodes.is_empty() {
            return Err(MetaError::failed_precondition(
                "no cluster nodes to place the queue on",
            ));
        }
        let group_size = arguments
            .get("x-quorum-initial-group-size")
            .and_then(Value::as_i64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(DEFAULT_GROUP_SIZE)
            .min(nodes.len());
        let first = match locator.as_deref() {
            Some("client-local") => origin.and_then(|o| nodes.iter().position(|n| *n == o)),
            Some("balanced") => Some(least_leading),
            _ => None,
        };
        let start = first.unwrap_or((next_id % nodes.len() as u64) as usize);
        let members = (0..group_size)
            .map(|i| nodes[(start + i) % nodes.len()])
            .collect();

        let queue = QueueMeta {
            id: next_id,
            vhost: vhost.to_string(),
            name: name.to_string(),
            arguments,
            members,
            config,
            owner,
            learners: Vec::new(),
        };
        v.queues.insert(name.to_string(), queue.clone());
        self.queue_ids
            .insert(next_id, (vhost.to_string(), name.to_string()));
        self.next_queue_id += 1;
        effects.push(MetaEffect::QueueCreated(queue.clone()));
        Ok(MetaReply::QueueDeclared {
            queue,
            created: true,
        })
    }

    /// The index in `nodes` (sorted) of the node that is the first member (initial or
    /// rebalanced leader) of the fewest queues; the lowest id on a tie. Replicated state only.
    fn least_leading(&self, nodes: &[NodeId]) -> usize {
        let mut led: BTreeMap<NodeId, usize> = nodes.iter().map(|n| (*n, 0)).collect();
        for q in self.queues() {
            if let Some(c) = q.members.first().and_then(|f| led.get_mut(f)) {
                *c += 1;
            }
        }
        let mut best = 0;
        for (i, n) in nodes.iter().enumerate() {
            if led[n] < led[&nodes[best]] {
                best = i;
            }
        }
        best
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_queue_members(
        &mut self,
        vhost: &str,
        name: &str,
        id: QueueId,
        expected: &[NodeId],
        members: Vec<NodeId>,
        learners: Vec<NodeId>,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        let Some(q) = v.queues.get_mut(name).filter(|q| q.id == id) else {
            return Err(queue_not_found(vhost, name));
        };
        if q.members != expected {
            return Err(MetaError::failed_precondition(format!(
                "queue '{name}' in vhost '{vhost}': its members changed meanwhile \
                 (now {:?}, expected {expected:?}); try again",
                q.members
            )));
        }
        if members.is_empty() {
            return Err(MetaError::failed_precondition(format!(
                "queue '{name}' in vhost '{vhost}': cannot remove its last member"
            )));
        }
        let mut seen = BTreeSet::new();
        if let Some(n) = members.iter().chain(&learners).find(|n| !seen.insert(**n)) {
            return Err(MetaError::invalid(format!(
                "members: node {n} is listed twice (members and learners are distinct)"
            )));
        }
        q.members = members;
        q.learners = learners;
        effects.push(MetaEffect::QueueMembersChanged(q.clone()));
        Ok(MetaReply::Ok)
    }

    pub(super) fn delete_queue(
        &mut self,
        vhost: &str,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        let queue = v
            .queues
            .remove(name)
            .ok_or_else(|| queue_not_found(vhost, name))?;
        v.remove_bindings(|b| b.destination == name, |_| false);
        self.queue_ids.remove(&queue.id);
        effects.push(MetaEffect::QueueDeleted(queue.clone()));
        Ok(MetaReply::QueueDeleted { queue })
    }
}

/// A new queue's leader locator: the argument wins over the policy (RabbitMQ's
/// rabbit_queue_location).
fn leader_locator<'a>(arguments: &'a Table, matching: Option<&'a Policy>) -> Option<&'a str> {
    arguments
        .get("x-queue-leader-locator")
        .or_else(|| matching.and_then(|p| p.definition.get("queue-leader-locator")))
        .and_then(Value::as_str)
}

/// A redeclare must carry the same value (or the same absence) for every argument quorumq
/// interprets; `x-queue-type` absent means `quorum`.
fn check_equivalent(
    vhost: &str,
    name: &str,
    current: &Table,
    received: &Table,
) -> Result<(), MetaError> {
    let quorum = Value::String("quorum".into());
    for key in policy::known_argument_names() {
        let normalize = |t: &'_ Table| -> Option<Value> {
            match t.get(&key) {
                None if key == "x-queue-type" => Some(quorum.clone()),
                other => other.cloned(),
            }
        };
        let (cur, rec) = (normalize(current), normalize(received));
        if cur != rec {
            let what = format!("queue '{name}' in vhost '{vhost}'");
            return Err(inequivalent_arg(&what, &key, rec.as_ref(), cur.as_ref()));
        }
    }
    Ok(())
}

/// The exchange arguments a redeclare must repeat: RabbitMQ compares only
/// `alternate-exchange` (`rabbit_exchange:assert_args_equivalence`).
pub(super) const EXCHANGE_EQUIVALENCE_ARGS: [&str; 1] = ["alternate-exchange"];

/// RabbitMQ's refusal of a redeclare whose argument `key` differs (`rabbit_misc:
/// equivalence_fail`); `what` names the queue or exchange and its vhost.
pub(super) fn inequivalent_arg(
    what: &str,
    key: &str,
    received: Option<&Value>,
    current: Option<&Value>,
) -> MetaError {
    MetaError::failed_precondition(format!(
        "inequivalent arg '{key}' for {what}: received {} but current is {}",
        show_arg(received),
        show_arg(current)
    ))
}

impl MetaState {
    /// The metadata's invariants, checked when a snapshot of it is written and installed:
    /// every queue is where its record says, has an id below the next one (ids are never
    /// reused), and is found by that id in the index `queue_by_id` reads, which holds nothing
    /// else.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut queues = 0usize;
        for (vhost, v) in &self.vhosts {
            for (name, q) in &v.queues {
                queues += 1;
                let at = format!("queue '{}' in vhost '{}'", shown(name), shown(vhost));
                if q.vhost != *vhost || q.name != *name {
                    return Err(format!(
                        "{at} is recorded as '{}' in '{}'",
                        shown(&q.name),
                        shown(&q.vhost)
                    ));
                }
                if q.id == 0 || q.id >= self.next_queue_id {
                    return Err(format!(
                        "{at} has id {}, outside 1..{}",
                        q.id, self.next_queue_id
                    ));
                }
                if self.queue_ids.get(&q.id) != Some(&(vhost.clone(), name.clone())) {
                    return Err(format!("{at}: its id {} is not indexed to it", q.id));
                }
            }
        }
        if self.queue_ids.len() != queues {
            return Err(format!(
                "the queue index holds {} ids for {queues} queues",
                self.queue_ids.len()
            ));
        }
        Ok(())
    }
}
