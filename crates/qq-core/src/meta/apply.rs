//! [`MetaState::apply`]: one committed command at a time, each handler deciding its reply and
//! the effects the node carries out (module documentation of [`super`]).

use super::operator_policies::recompute_configs;
use super::queues::{EXCHANGE_EQUIVALENCE_ARGS, inequivalent_arg};
use super::*;

impl MetaState {
    /// Applies one committed command. On error nothing changed.
    pub fn apply(&mut self, cmd: MetaCommand) -> (Result<MetaReply, MetaError>, Vec<MetaEffect>) {
        // A committed command outside the bounds (only a faulty proposer makes one) changes
        // nothing, on every replica alike.
        if let Err(e) = cmd.validate().and_then(|()| self.check_runs(&cmd)) {
            return (Err(e), Vec::new());
        }
        let mut effects = Vec::new();
        let result = match cmd {
            cmd @ (MetaCommand::PutVhost { .. }
            | MetaCommand::DeleteVhost { .. }
            | MetaCommand::PutUser { .. }
            | MetaCommand::DeleteUser { .. }
            | MetaCommand::SetPermissions { .. }
            | MetaCommand::SetVhostLimits { .. }
            | MetaCommand::SetUserLimits { .. }) => self.apply_access(cmd, &mut effects),
            cmd @ (MetaCommand::DeclareExchange { .. }
            | MetaCommand::DeleteExchange { .. }
            | MetaCommand::Bind { .. }
            | MetaCommand::Unbind { .. }) => self.apply_exchanges(cmd),
            cmd @ (MetaCommand::DeclareQueue { .. }
            | MetaCommand::DeleteQueue { .. }
            | MetaCommand::SetPolicy { .. }
            | MetaCommand::ClearPolicy { .. }) => self.apply_queues(cmd, &mut effects),
            cmd @ (MetaCommand::SetQueueMembers { .. }
            | MetaCommand::JoinNode { .. }
            | MetaCommand::ForgetNode { .. }) => self.apply_cluster(cmd, &mut effects),
            cmd @ (MetaCommand::SetMachineVersion { .. }
            | MetaCommand::BindExchange { .. }
            | MetaCommand::UnbindExchange { .. }
            | MetaCommand::SetOperatorPolicy { .. }
            | MetaCommand::ClearOperatorPolicy { .. }
            | MetaCommand::RecordIncarnation { .. }) => self.apply_v2(cmd, &mut effects),
        };
        (result, effects)
    }

    /// Vhosts, users, permissions and limits.
    fn apply_access(
        &mut self,
        cmd: MetaCommand,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        match cmd {
            MetaCommand::PutVhost { name } => self.put_vhost(name),
            MetaCommand::DeleteVhost { name } => self.delete_vhost(&name, effects),
            MetaCommand::PutUser {
                name,
                password_hash,
                salt,
                tags,
            } => self.put_user(name, password_hash, salt, tags),
            MetaCommand::DeleteUser { name } => self.delete_user(&name),
            MetaCommand::SetPermissions {
                user,
                vhost,
                configure,
                write,
                read,
            } => self.set_permissions(
                user,
                &vhost,
                Permissions {
                    configure,
                    write,
                    read,
                },
            ),
            MetaCommand::SetVhostLimits { vhost, limits } => self.set_vhost_limits(vhost, limits),
            MetaCommand::SetUserLimits { user, limits } => self.set_user_limits(user, limits),
            _ => Err(MetaError::invalid("not a command of this group")),
        }
    }

    /// Exchanges and bindings of queues to them.
    fn apply_exchanges(&mut self, cmd: MetaCommand) -> Result<MetaReply, MetaError> {
        match cmd {
            MetaCommand::DeclareExchange {
                vhost,
                name,
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
                passive,
                owner,
            } => self.declare_exchange(
                &vhost,
                &name,
                &kind,
                durable,
                auto_delete,
                internal,
                arguments,
                passive,
                owner,
            ),
            MetaCommand::DeleteExchange {
                vhost,
                name,
                if_unused,
            } => self.delete_exchange(&vhost, &name, if_unused),
            MetaCommand::Bind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => self.bind(&vhost, queue, exchange, routing_key, arguments, true),
            MetaCommand::Unbind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => self.bind(&vhost, queue, exchange, routing_key, arguments, false),
            _ => Err(MetaError::invalid("not a command of this group")),
        }
    }

    /// Queues and policies.
    fn apply_queues(
        &mut self,
        cmd: MetaCommand,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        match cmd {
            MetaCommand::DeclareQueue {
                vhost,
                name,
                arguments,
                passive,
                nodes,
                owner,
                origin,
            } => self.declare_queue(
                &vhost,
                &name,
                arguments,
                passive,
                Placement { nodes, origin },
                owner,
                effects,
            ),
            MetaCommand::DeleteQueue { vhost, name } => self.delete_queue(&vhost, &name, effects),
            MetaCommand::SetPolicy {
                vhost,
                name,
                pattern,
                apply_to,
                priority,
                definition,
            } => self.set_policy(
                &vhost,
                Policy {
                    name,
                    pattern,
                    apply_to,
                    priority,
                    definition,
                },
                effects,
            ),
            MetaCommand::ClearPolicy { vhost, name } => self.clear_policy(&vhost, &name, effects),
            _ => Err(MetaError::invalid("not a command of this group")),
        }
    }

    /// The queues' replicas and the cluster's nodes.
    fn apply_cluster(
        &mut self,
        cmd: MetaCommand,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        match cmd {
            MetaCommand::SetQueueMembers {
                vhost,
                name,
                id,
                expected,
                members,
                learners,
            } => self.set_queue_members(&vhost, &name, id, &expected, members, learners, effects),
            MetaCommand::JoinNode {
                id,
                address,
                cluster_address,
            } => self.join_node(id, address, cluster_address, effects),
            MetaCommand::ForgetNode { id } => self.forget_node(id, effects),
            _ => Err(MetaError::invalid("not a command of this group")),
        }
    }

    /// The commands of metadata machine version 2 (module `machine`).
    fn apply_v2(
        &mut self,
        cmd: MetaCommand,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        match cmd {
            MetaCommand::SetMachineVersion { version } => self.set_machine_version(version),
            MetaCommand::BindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            } => self.bind_exchange(
                &vhost,
                Binding {
                    source,
                    destination,
                    routing_key,
                    arguments,
                },
                true,
            ),
            MetaCommand::UnbindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            } => self.bind_exchange(
                &vhost,
                Binding {
                    source,
                    destination,
                    routing_key,
                    arguments,
                },
                false,
            ),
            MetaCommand::SetOperatorPolicy {
                vhost,
                name,
                pattern,
                apply_to,
                priority,
                definition,
            } => self.set_operator_policy(
                &vhost,
                Policy {
                    name,
                    pattern,
                    apply_to,
                    priority,
                    definition,
                },
                effects,
            ),
            MetaCommand::ClearOperatorPolicy { vhost, name } => {
                self.clear_operator_policy(&vhost, &name, effects)
            }
            MetaCommand::RecordIncarnation { id, incarnation } => {
                self.record_incarnation(id, incarnation)
            }
            _ => Err(MetaError::invalid(
                "not a command of metadata machine version 2",
            )),
        }
    }

    fn join_node(
        &mut self,
        id: NodeId,
        address: String,
        cluster_address: String,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        if self.forgotten.contains(&id) && self.machine_version < 2 {
            return Err(MetaError::failed_precondition(format!(
                "id: node {id} was forgotten, and a forgotten id joins again only once every \
                 node runs metadata machine version 2 (the cluster runs {})",
                self.machine_version
            )));
        }
        let addrs = NodeAddrs {
            address,
            cluster_address,
        };
        // A forgotten id joins again as a new member: it holds no replica and is in no
        // group's membership (forgetting made sure of both), so nothing it kept on its disk
        // from before counts for anything (docs/operating.md "Re-seeding a node").
        if self.forgotten.remove(&id) {
            self.joined.insert(id, addrs);
            effects.push(MetaEffect::NodesChanged);
            return Ok(MetaReply::Ok);
        }
        match self.joined.get(&id) {
            Some(known) if *known == addrs => return Ok(MetaReply::Ok),
            Some(_) => {
                return Err(MetaError::new(
                    ErrorKind::AlreadyExists,
                    format!("id: node {id} already joined with other addresses"),
                ));
            }
            None => {}
        }
        self.joined.insert(id, addrs);
        effects.push(MetaEffect::NodesChanged);
        Ok(MetaReply::Ok)
    }

    fn forget_node(
        &mut self,
        id: NodeId,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let holding: Vec<String> = self
            .queues()
            .filter(|q| q.replicas().any(|n| n == id))
            .take(10)
            .map(|q| format!("{}/{}", q.vhost, q.name))
            .collect();
        if !holding.is_empty() {
            return Err(MetaError::failed_precondition(format!(
                "id: node {id} still holds replicas of {} (shrink them first)",
                holding.join(", ")
            )));
        }
        self.joined.remove(&id);
        self.incarnations.remove(&id);
        if self.forgotten.insert(id) {
            effects.push(MetaEffect::NodesChanged);
        }
        Ok(MetaReply::Ok)
    }

    fn record_incarnation(&mut self, id: NodeId, incarnation: u64) -> Result<MetaReply, MetaError> {
        if self.forgotten.contains(&id) {
            return Err(MetaError::failed_precondition(format!(
                "id: node {id} was forgotten; it records its incarnation once it joined again"
            )));
        }
        match self.incarnations.get(&id) {
            Some(known) if *known == incarnation => Ok(MetaReply::Ok),
            Some(known) => Err(MetaError::failed_precondition(format!(
                "incarnation: node {id} runs on data directory {known:016x}, not \
                 {incarnation:016x}: a node whose directory was replaced must be re-seeded \
                 (forgotten and joined again) first"
            ))),
            None => {
                self.incarnations.insert(id, incarnation);
                Ok(MetaReply::Ok)
            }
        }
    }

    pub(super) fn vhost_mut(&mut self, vhost: &str) -> Result<&mut Vhost, MetaError> {
        self.vhosts
            .get_mut(vhost)
            .ok_or_else(|| vhost_not_found(vhost))
    }

    fn put_vhost(&mut self, name: String) -> Result<MetaReply, MetaError> {
        check_name("vhost", &name)?;
        self.vhosts
            .entry(name)
            .or_insert_with(Vhost::with_default_exchanges);
        Ok(MetaReply::Ok)
    }

    fn delete_vhost(
        &mut self,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let vhost = self
            .vhosts
            .remove(name)
            .ok_or_else(|| vhost_not_found(name))?;
        self.vhost_limits.remove(name);
        for queue in vhost.queues.into_values() {
            self.queue_ids.remove(&queue.id);
            effects.push(MetaEffect::QueueDeleted(queue));
        }
        Ok(MetaReply::Ok)
    }

    fn put_user(
        &mut self,
        name: String,
        password_hash: Vec<u8>,
        salt: Vec<u8>,
        tags: Vec<String>,
    ) -> Result<MetaReply, MetaError> {
        check_name("user", &name)?;
        self.users.insert(
            name.clone(),
            User {
                name,
                password_hash,
                salt,
                tags,
            },
        );
        Ok(MetaReply::Ok)
    }

    fn delete_user(&mut self, name: &str) -> Result<MetaReply, MetaError> {
        self.users
            .remove(name)
            .ok_or_else(|| MetaError::not_found(format!("user '{name}' not found")))?;
        self.user_limits.remove(name);
        for vhost in self.vhosts.values_mut() {
            vhost.permissions.remove(name);
        }
        Ok(MetaReply::Ok)
    }

    fn set_permissions(
        &mut self,
        user: String,
        vhost: &str,
        permissions: Permissions,
    ) -> Result<MetaReply, MetaError> {
        if !self.users.contains_key(&user) {
            return Err(MetaError::not_found(format!("user '{user}' not found")));
        }
        compile("configure", &permissions.configure)?;
        compile("write", &permissions.write)?;
        compile("read", &permissions.read)?;
        self.vhost_mut(vhost)?.permissions.insert(user, permissions);
        Ok(MetaReply::Ok)
    }

    #[allow(clippy::too_many_arguments)]
    fn declare_exchange(
        &mut self,
        vhost: &str,
        name: &str,
        kind: &str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Table,
        passive: bool,
        owner: Option<String>,
    ) -> Result<MetaReply, MetaError> {
        let owned = owner.as_deref().map_or(0, |u| {
            self.count_owned(u, |v| v.exchanges.values().map(|x| &x.owner))
        });
        let user_limits = owner.as_deref().map(|u| self.user_limits(u));
        let vhost_limits = self.vhost_limits(vhost);
        let v = self.vhost_mut(vhost)?;
        if passive {
            return if is_default_exchange(name) || v.exchanges.contains_key(name) {
                Ok(MetaReply::Ok)
            } else {
                Err(exchange_not_found(vhost, name))
            };
        }
        if is_default_exchange(name) {
            return Err(default_exchange_refused());
        }
        check_name("exchange", name)?;
        let kind_parsed = ExchangeType::parse(kind)
            .ok_or_else(|| MetaError::invalid(format!("type: unknown exchange type '{kind}'")))?;
        if let Some(current) = v.exchanges.get(name) {
            let inequivalent = |arg: &str, received: &str, current: &str| {
                MetaError::failed_precondition(format!(
                    "inequivalent arg '{arg}' for exchange '{name}' in vhost '{vhost}': \
                     received '{received}' but current is '{current}'"
                ))
            };
            if current.kind != kind_parsed {
                return Err(inequivalent("type", kind, current.kind.as_str()));
            }
            for (arg, received, cur) in [
                ("durable", durable, current.durable),
                ("auto_delete", auto_delete, current.auto_delete),
                ("internal", internal, current.internal),
            ] {
                if received != cur {
                    return Err(inequivalent(arg, &received.to_string(), &cur.to_string()));
                }
            }
            for key in EXCHANGE_EQUIVALENCE_ARGS {
                let (received, cur) = (arguments.get(key), current.arguments.get(key));
                if received != cur {
                    let what = format!("exchange '{name}' in vhost '{vhost}'");
                    return Err(inequivalent_arg(&what, key, received, cur));
                }
            }
            return Ok(MetaReply::Ok);
        }
        check_not_reserved("exchange", name)?;
        // The predeclared `amq.*` exchanges do not count.
        let declared = v
            .exchanges
            .keys()
            .filter(|n| !n.starts_with("amq."))
            .count() as u64;
        vhost_limits.admit(Counted::Exchanges, Scope::Vhost(vhost), declared)?;
        if let (Some(u), Some(limits)) = (owner.as_deref(), user_limits) {
            limits.admit(Counted::Exchanges, Scope::User(u), owned)?;
        }
        v.exchanges.insert(
            name.to_string(),
            Exchange {
                name: name.to_string(),
                kind: kind_parsed,
                durable,
                auto_delete,
                internal,
                arguments,
                owner,
            },
        );
        Ok(MetaReply::Ok)
    }

    fn delete_exchange(
        &mut self,
        vhost: &str,
        name: &str,
        if_unused: bool,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        if is_default_exchange(name) {
            return Err(default_exchange_refused());
        }
        if name.starts_with("amq.") {
            return Err(MetaError::permission_denied(format!(
                "deletion of system exchange '{name}' in vhost '{vhost}' not allowed"
            )));
        }
        if !v.exchanges.contains_key(name) {
            return Err(exchange_not_found(vhost, name));
        }
        if if_unused && v.is_source(name) {
            return Err(MetaError::failed_precondition(format!(
                "exchange '{name}' in vhost '{vhost}' in use"
            )));
        }
        v.exchanges.remove(name);
        v.bindings.retain(|b| b.source != name);
        v.exchange_bindings.retain(|b| b.source != name);
        // Bindings to it go too, and an auto-delete source left without any is deleted.
        v.remove_bindings(|_| false, |b| b.destination == name);
        Ok(MetaReply::Ok)
    }

    /// How many of the objects `of` lists in every vhost belong to `user`.
    pub(super) fn count_owned<'a, I>(&'a self, user: &str, of: impl Fn(&'a Vhost) -> I) -> u64
    where
        I: Iterator<Item = &'a Option<String>>,
    {
        self.vhosts
            .values()
            .flat_map(of)
            .filter(|o| o.as_deref() == Some(user))
            .count() as u64
    }

    fn set_vhost_limits(&mut self, vhost: String, limits: Limits) -> Result<MetaReply, MetaError> {
        if !self.vhosts.contains_key(&vhost) {
            return Err(vhost_not_found(&vhost));
        }
        if limits.is_unlimited() {
            self.vhost_limits.remove(&vhost);
        } else {
            self.vhost_limits.insert(vhost, limits);
        }
        Ok(MetaReply::Ok)
    }

    fn set_user_limits(&mut self, user: String, limits: Limits) -> Result<MetaReply, MetaError> {
        if !self.users.contains_key(&user) {
            return Err(MetaError::not_found(format!("user '{user}' not found")));
        }
        if limits.is_unlimited() {
            self.user_limits.remove(&user);
        } else {
            self.user_limits.insert(user, limits);
        }
        Ok(MetaReply::Ok)
    }

    fn bind(
        &mut self,
        vhost: &str,
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: Table,
        add: bool,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        if is_default_exchange(&exchange) {
            return Err(default_exchange_refused());
        }
        let kind = v
            .exchanges
            .get(&exchange)
            .ok_or_else(|| exchange_not_found(vhost, &exchange))?
            .kind;
        if !v.queues.contains_key(&queue) {
            return Err(queue_not_found(vhost, &queue));
        }
        let binding = Binding {
            source: exchange,
            destination: queue,
            routing_key,
            arguments,
        };
        if add {
            route::validate_binding_arguments(kind, &binding.arguments)?;
            v.bindings.insert(binding);
        } else {
            v.remove_bindings(|b| *b == binding, |_| false);
        }
        Ok(MetaReply::Ok)
    }

    fn set_policy(
        &mut self,
        vhost: &str,
        policy: Policy,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let version = self.machine_version();
        let v = self.vhost_mut(vhost)?;
        check_name("policy", &policy.name)?;
        compile("pattern", &policy.pattern)?;
        if !policy::valid_apply_to(&policy.apply_to) {
            return Err(MetaError::invalid(format!(
                "apply_to: expected all, queues, quorum_queues or exchanges, got '{}'",
                policy.apply_to
            )));
        }
        policy::validate_policy_definition(&policy.definition)?;
        // Release 0.1.0 did not know this key and refused it: a log that runs its machine
        // still does, so its replicas and today's agree.
        if version < 2 && policy.definition.contains_key("alternate-exchange") {
            return Err(MetaError::invalid(
                "definition: 'alternate-exchange' needs metadata machine version 2 (every node \
                 must run a release that has alternate exchanges)",
            ));
        }
        v.policies.insert(policy.name.clone(), policy);
        recompute_configs(vhost, v, effects);
        Ok(MetaReply::Ok)
    }

    fn clear_policy(
        &mut self,
        vhost: &str,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        v.policies.remove(name).ok_or_else(|| {
            MetaError::not_found(format!("no policy '{name}' in vhost '{vhost}'"))
        })?;
        recompute_configs(vhost, v, effects);
        Ok(MetaReply::Ok)
    }
}
