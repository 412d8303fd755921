//! The management page on `http_addr`: server-rendered HTML, no script, nothing loaded from
//! elsewhere, each signed-in view reloading itself every few seconds.
//!
//! Routes: `GET /login` (the form), `POST /login` (the broker's users, checked by
//! [`crate::api::auth::Auth::login_http`]: the same rules and Argon2id verification as the
//! gRPC API, loopback-only users only from a loopback HTTP peer, a wrong password logged with
//! the peer address), `POST /logout`; and, signed in, `GET /` (overview: nodes, health, alarms,
//! leaders per node, totals), `/queues`, `/queue?name=` (effective settings with the policy
//! that set each, the dead-letter target, x-death reasons by count), `/exchanges`,
//! `/bindings`, `/policies`, each with `?vhost=` (default `/`, else the first one visible).
//! Without a live session every view answers 303 to `/login`.
//!
//! Visibility is the API's: the views read through the same functions as `ListQueues`,
//! `GetQueue`, `ListExchanges`, `ListBindings`, `ListPolicies`, `ClusterStatus`, `Overview`
//! and `Browse` ([`crate::api::status`], [`crate::api::browse`]) with the signed-in caller, so
//! a user sees only the vhosts they may see (administrators all), and a vhost they may not see
//! answers 403 whether it exists or not. Sessions: [`session`]. The endpoint's bounds (requests
//! in flight, connections, their lifetime, body size) are [`super::http`]'s.
//!
//! Must not: change broker state (the only writes are its own sessions), or show a string
//! without escaping it ([`html::esc`]).

mod html;
pub mod rates;
pub mod session;
mod views;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use qq_core::deadletter::{Death, X_DEATH, X_LAST_DEATH_DETAIL};
use qq_core::meta::{MetaState, QueueMeta};
use qq_core::{Table, Value};
use tokio::sync::watch;
use tonic::{Code, Status};

use super::http::Peer;
use crate::api::auth::Caller;
use crate::api::browse::browse_of;
use crate::api::status::{
    bindings_of, cluster_status_of, exchanges_of, overview_of, policies_of, queue_of, queues_of,
};
use crate::api::{Api, browse::MAX_BROWSE_LIMIT};
use html::{Nav, Section, esc, layout};
use rates::Rates;
use session::Sessions;

/// Ready messages a queue's view reads for its x-death counts, at most (from the head).
pub const XDEATH_SCAN: u64 = 1000;
/// Distinct reason details counted on a queue's view, at most; more are counted as "other".
const MAX_DETAILS: usize = 50;
/// Query parameters read from a request, at most (the rest are ignored).
const MAX_PARAMS: usize = 8;

const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The page's state: the API's handlers' state, this node's health, sessions and rates.
pub struct Page {
    api: Api,
    serving: watch::Receiver<bool>,
    sessions: Sessions,
    rates: Rates,
}

/// The page's routes, ready to merge into the `http_addr` router.
pub fn router(api: Api, serving: watch::Receiver<bool>) -> Router {
    let clock = api.node().clock();
    let page = Arc::new(Page {
        api,
        serving,
        sessions: Sessions::new(clock),
        rates: Rates::default(),
    });
    Router::new()
        .route("/", get(overview))
        .route("/queues", get(queues))
        .route("/queue", get(queue))
        .route("/exchanges", get(exchanges))
        .route("/bindings", get(bindings))
        .route("/policies", get(policies))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .with_state(page)
}

/// An HTML answer with the page's security headers.
fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

fn redirect(to: &'static str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The HTTP status for a gRPC one (API.md's codes, as HTTP).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Query parameters (the first [`MAX_PARAMS`]; a repeated name keeps its first value).
fn params(query: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()).take(MAX_PARAMS) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    out
}

/// A signed-in request: who, the vhosts they may see, the vhost the view shows.
struct Signed {
    caller: Caller,
    vhosts: Vec<String>,
    vhost: String,
    params: HashMap<String, String>,
}

impl Page {
    /// The caller of a request with a live session, if any.
    fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        let auth = self.api.auth();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(session::token_from_cookies)
            .and_then(|token| {
                self.sessions
                    .user(token, |user| auth.credential_stamp(user))
            })
            .map(|user| Caller { user, peer: None })
    }

    fn signed(&self, headers: &HeaderMap, query: Option<&str>) -> Option<Signed> {
        let caller = self.caller(headers)?;
        let state = self.api.node().view().current();
        let vhosts: Vec<String> = state
            .vhosts()
            .filter(|v| self.api.auth().may_see(&state, &caller, v))
            .map(str::to_string)
            .collect();
        let params = params(query);
        let vhost = params.get("vhost").cloned().unwrap_or_else(|| {
            if vhosts.iter().any(|v| v == "/") {
                "/".to_string()
            } else {
                vhosts.first().cloned().unwrap_or_else(|| "/".to_string())
            }
        });
        Some(Signed {
            caller,
            vhosts,
            vhost,
            params,
        })
    }

    fn nav<'a>(&self, s: &'a Signed, section: Section, scoped: bool) -> Nav<'a> {
        Nav {
            user: &s.caller.user,
            node_id: self.api.node().id(),
            section,
            vhost: scoped.then_some(s.vhost.as_str()),
            vhosts: &s.vhosts,
        }
    }

    /// A view, or the error that kept it from being shown (in the same layout).
    fn view(
        &self,
        s: &Signed,
        section: Section,
        title: &str,
        body: Result<String, Status>,
    ) -> Response {
        let nav = self.nav(s, section, section != Section::Overview);
        match body {
            Ok(body) => html(StatusCode::OK, layout(title, Some(&nav), &body, true)),
            Err(status) => html(
                http_status(status.code()),
                layout(
                    title,
                    Some(&nav),
                    &format!(
                        "<p id=\"error\" class=\"bad\">{}: {}</p>",
                        esc(&format!("{:?}", status.code())),
                        esc(status.message())
                    ),
                    false,
                ),
            ),
        }
    }
}

async fn login_form(State(page): State<Arc<Page>>, headers: HeaderMap) -> Response {
    if page.caller(&headers).is_some() {
        return redirect("/");
    }
    html(
        StatusCode::OK,
        layout("Log in", None, &views::login(None, ""), false),
    )
}

async fn login(
    State(page): State<Arc<Page>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    body: Bytes,
) -> Response {
    let mut user = None;
    let mut password = None;
    for (k, v) in form_urlencoded::parse(&body).take(MAX_PARAMS) {
        match &*k {
            "username" if user.is_none() => user = Some(v.into_owned()),
            "password" if password.is_none() => password = Some(v.into_owned()),
            _ => {}
        }
    }
    let refuse = |status: StatusCode, message: &str, user: &str| {
        html(
            status,
            layout("Log in", None, &views::login(Some(message), user), false),
        )
    };
    let user = user.unwrap_or_default();
    if user.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "username: a user name is required",
            "",
        );
    }
    let Some(password) = password else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "password: the field is missing",
            &user,
        );
    };
    let auth = page.api.auth();
    match auth.login_http(&user, password, Some(peer)).await {
        Ok(caller) => {
            let Some(stamp) = auth.credential_stamp(&caller.user) else {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    &format!("invalid credentials for user '{user}'"),
                    &user,
                );
            };
            let token = page.sessions.create(&caller.user, stamp);
            let mut r = redirect("/");
            if let Ok(cookie) = HeaderValue::from_str(&session::set_cookie(&token)) {
                r.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            r
        }
        Err(status) => refuse(
            http_status(status.code()),
            &format!("Login failed: {}", status.message()),
            &user,
        ),
    }
}

async fn logout(State(page): State<Arc<Page>>, headers: HeaderMap) -> Response {
    if let Some(token) = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(session::token_from_cookies)
    {
        page.sessions.end(token);
    }
    let mut r = redirect("/login");
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&session::clear_cookie())
            .unwrap_or_else(|_| HeaderValue::from_static("")),
    );
    r
}

async fn overview(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(s) = page.signed(&headers, query.as_deref()) else {
        return redirect("/login");
    };
    let status = cluster_status_of(&page.api, &s.caller).await;
    let totals = overview_of(&page.api, &s.caller).await;
    let body = views::overview(&views::Overview {
        node_id: page.api.node().id(),
        serving: *page.serving.borrow(),
        status: &status,
        totals: &totals,
    });
    page.view(&s, Section::Overview, "Overview", Ok(body))
}

async fn queues(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(s) = page.signed(&headers, query.as_deref()) else {
        return redirect("/login");
    };
    let title = format!("Queues of {}", s.vhost);
    let body = match queues_of(&page.api, &s.caller, &s.vhost).await {
        Ok(list) => {
            let state = page.api.node().view().current();
            let now = page.api.node().clock().now();
            let rates: Vec<_> = list
                .iter()
                .map(|(q, d)| {
                    d.as_ref().and_then(|d| {
                        let (enqueued, delivered) =
                            (d.stats.enqueued_total, d.stats.delivered_total);
                        page.rates.observe(q.id, enqueued, delivered, now)
                    })
                })
                .collect();
            let rows: Vec<views::QueueRow<'_>> = list
                .iter()
                .zip(rates)
                .map(|((q, d), rate)| views::QueueRow {
                    meta: q,
                    policy: state.policy_of(q),
                    operator: state.operator_policy_of(q),
                    info: d.as_ref(),
                    rate,
                })
                .collect();
            Ok(views::queues(&s.vhost, &rows))
        }
        Err(e) => Err(e),
    };
    page.view(&s, Section::Queues, &title, body)
}

/// Where a dead letter of `q` goes, as HTML.
fn dead_letter_target(state: &MetaState, q: &QueueMeta) -> String {
    let c = &q.config;
    let Some(dlx) = &c.dead_letter_exchange else {
        return "<p>None: this queue has no dead-letter exchange; messages that die here are \
                dropped.</p>"
            .to_string();
    };
    let shown = if dlx.is_empty() {
        "the default exchange".to_string()
    } else {
        format!("exchange <strong>{}</strong>", esc(dlx))
    };
    let mut out = format!(
        "<p>Dead letters go to {shown} ({}), ",
        esc(c.dead_letter_strategy.as_str())
    );
    let keys: Vec<String> = match &c.dead_letter_routing_key {
        Some(k) => {
            out.push_str(&format!("with routing key <strong>{}</strong>.", esc(k)));
            vec![k.clone()]
        }
        None => {
            out.push_str("with each message's own routing keys.");
            Vec::new()
        }
    };
    out.push_str("</p>");
    if keys.is_empty() {
        if dlx.is_empty() {
            return out;
        }
        let bound: Vec<String> = state
            .bindings(&q.vhost)
            .filter(|b| b.source == *dlx)
            .map(|b| {
                format!(
                    "{} (key {})",
                    views::queue_link(&q.vhost, &b.destination),
                    esc(&b.routing_key)
                )
            })
            .collect();
        out.push_str(&format!(
            "<p>Queues bound to it: {}.</p>",
            if bound.is_empty() {
                "none".to_string()
            } else {
                bound.join(", ")
            }
        ));
        return out;
    }
    match state.route(&q.vhost, dlx, &keys, &Table::new()) {
        Ok(targets) if targets.is_empty() => out.push_str(
            "<p class=\"bad\">It routes to no queue now: dead letters would be dropped.</p>",
        ),
        Ok(targets) => {
            let names: Vec<String> = targets
                .iter()
                .map(|t| views::queue_link(&t.vhost, &t.name))
                .collect();
            out.push_str(&format!(
                "<p>It routes to: <span id=\"dead-letter-queues\">{}</span> (headers not \
                 considered).</p>",
                names.join(", ")
            ));
        }
        Err(e) => out.push_str(&format!("<p class=\"bad\">{}</p>", esc(&e.to_string()))),
    }
    out
}

/// Counts the x-death history of the first [`XDEATH_SCAN`] ready messages of a queue.
async fn death_counts(
    page: &Page,
    caller: &Caller,
    vhost: &str,
    name: &str,
) -> Result<views::DeathCounts, String> {
    let mut counts = views::DeathCounts::default();
    let mut offset = 0;
    while counts.scanned < XDEATH_SCAN {
        let limit = (XDEATH_SCAN - counts.scanned).min(u64::from(MAX_BROWSE_LIMIT)) as u32;
        let data = browse_of(&page.api, caller, vhost, name, offset, limit)
            .await
            .map_err(|e| match e.code() {
                Code::PermissionDenied => format!(
                    "Not shown: reading the messages needs read permission on this queue ({}).",
                    e.message()
                ),
                _ => format!("Not shown: {}", e.message()),
            })?;
        counts.ready = data.ready;
        let Some(last) = data.messages.last().map(|(b, _)| b.position) else {
            break;
        };
        for (_, m) in &data.messages {
            counts.scanned += 1;
            count_deaths(&mut counts, &m.properties.headers);
        }
        offset = last + 1;
    }
    Ok(counts)
}

fn count_deaths(counts: &mut views::DeathCounts, headers: &Table) {
    let Some(Value::List(entries)) = headers.get(X_DEATH) else {
        return;
    };
    for d in entries.iter().filter_map(Death::from_value) {
        let e = counts.by_reason.entry((d.reason, d.queue)).or_default();
        e.0 += 1;
        e.1 += u64::try_from(d.count).unwrap_or(0);
    }
    if let Some(detail) = headers.get(X_LAST_DEATH_DETAIL).and_then(Value::as_str) {
        if let Some(n) = counts.details.get_mut(detail) {
            *n += 1;
        } else if counts.details.len() < MAX_DETAILS {
            counts.details.insert(detail.to_string(), 1);
        } else {
            counts.details_other += 1;
        }
    }
}

async fn queue(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(s) = page.signed(&headers, query.as_deref()) else {
        return redirect("/login");
    };
    let name = s.params.get("name").cloned().unwrap_or_default();
    let title = format!("Queue {name}");
    let body = match queue_of(&page.api, &s.caller, &s.vhost, &name).await {
        Ok((meta, info)) => {
            let deaths = death_counts(&page, &s.caller, &s.vhost, &name).await;
            let state = page.api.node().view().current();
            Ok(views::queue(&views::QueueView {
                meta: &meta,
                policy: state.policy_of(&meta),
                operator: state.operator_policy_of(&meta),
                info: &info,
                target: dead_letter_target(&state, &meta),
                deaths,
                scan_limit: XDEATH_SCAN,
            }))
        }
        Err(e) => Err(e),
    };
    page.view(&s, Section::Queues, &title, body)
}

async fn exchanges(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(s) = page.signed(&headers, query.as_deref()) else {
        return redirect("/login");
    };
    let body =
        exchanges_of(&page.api, &s.caller, &s.vhost).map(|xs| views::exchanges(&s.vhost, &xs));
    page.view(
        &s,
        Section::Exchanges,
        &format!("Exchanges of {}", s.vhost),
        body,
    )
}

async fn bindings(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(s) = page.signed(&headers, query.as_deref()) else {
        return redirect("/login");
    };
    let exchange = s.params.get("exchange").map(String::as_str);
    let body = bindings_of(&page.api, &s.caller, &s.vhost)
        .map(|bs| views::bindings(&s.vhost, &bs, exchange));
    page.view(
        &s,
        Section::Bindings,
        &format!("Bindings of {}", s.vhost),
        body,
    )
}

async fn policies(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(s) = page.signed(&headers, query.as_deref()) else {
        return redirect("/login");
    };
    let body = policies_of(&page.api, &s.caller, &s.vhost, false).and_then(|ps| {
        let ops = policies_of(&page.api, &s.caller, &s.vhost, true)?;
        let mut html = views::policies("policies", &ps);
        if !ops.is_empty() {
            html.push_str("<h2>Operator policies</h2>");
            html.push_str(&views::policies("operator-policies", &ops));
        }
        Ok(html)
    });
    page.view(
        &s,
        Section::Policies,
        &format!("Policies of {}", s.vhost),
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use qq_core::deadletter::Death;

    fn death(queue: &str, reason: &str, count: i64) -> Value {
        Death {
            queue: queue.into(),
            reason: reason.into(),
            count,
            time_s: 0,
            exchange: String::new(),
            routing_keys: vec![queue.into()],
            original_expiration: None,
            reason_detail: None,
        }
        .to_value()
    }

    #[test]
    fn deaths_are_counted_by_reason_and_queue() {
        let mut counts = views::DeathCounts::default();
        let mut h = Table::new();
        h.insert(
            X_DEATH.into(),
            Value::List(vec![
                death("work", "rejected", 2),
                death("work", "expired", 1),
            ]),
        );
        h.insert(X_LAST_DEATH_DETAIL.into(), Value::String("bad id".into()));
        count_deaths(&mut counts, &h);
        count_deaths(&mut counts, &h);
        count_deaths(&mut counts, &Table::new());
        assert_eq!(
            counts.by_reason.get(&("rejected".into(), "work".into())),
            Some(&(2, 4))
        );
        assert_eq!(
            counts.by_reason.get(&("expired".into(), "work".into())),
            Some(&(2, 2))
        );
        assert_eq!(counts.details.get("bad id"), Some(&2));
    }

    #[test]
    fn query_parameters_are_bounded_and_decoded() {
        let p = params(Some("vhost=%2Fa&name=x+y&vhost=other"));
        assert_eq!(p.get("vhost").map(String::as_str), Some("/a"));
        assert_eq!(p.get("name").map(String::as_str), Some("x y"));
        let many: Vec<String> = (0..100).map(|i| format!("k{i}=v")).collect();
        assert_eq!(params(Some(&many.join("&"))).len(), MAX_PARAMS);
    }
}
