// The operators' dashboard: read-only, one GraphQL endpoint, no build step.
//
// It reads the whole node list (paged) and the per-class summary, filters in
// the browser, and refreshes when the `events` subscription says something
// changed; where the schema has no such subscription (or the websocket fails)
// it polls instead. Ages are computed against the server's clock (the Date
// header of each answer), so a laptop with a wrong clock still shows "12s ago".
"use strict";

const GRAPHQL = new URL("graphql", document.baseURI).toString();
const TOKEN_KEY = "llmgw-inventory.token";
const POLL_MS = 5000;
// With a live subscription a slow poll still catches what produced no event.
const SAFETY_POLL_MS = 60000;
const STATES = ["READY", "CORDONED", "DRAINING", "UNREACHABLE", "LOST"];

const NODES_QUERY = `query DashboardNodes($after: ID) {
  nodes(after: $after) {
    id hostname state schedulable stateReason stateChangedBy lastSeen
    taints { key value effect source reason }
    drift { kind expected observed gpuIndices }
    remediations { id gpuIndices action state scope trigger }
    gpus { index gpuClass healthy healthReasons cordonReason stickyReasons recommendedAction
           taints { key value effect source reason } }
    freeGpus { gpuClass }
    fabrics { fabric }
    localDisk { freeBytes totalBytes }
    nvlinkGroups largestFreeNvlinkGroup
  }
}`;
const SUMMARY_QUERY = `query DashboardSummary {
  gpuClasses { gpuClass total free allocated unhealthy unschedulable }
  fabrics { name }
}`;
// One node's GPUs and its XIDs of the last day, for the node view.
const NODE_QUERY = `query DashboardNode($id: ID!) {
  node(id: $id) {
    id state
    taints { key value effect source reason }
    drift { kind expected observed gpuIndices }
    remediations { id gpuIndices action state scope trigger }
    gpus { index gpuClass healthy healthReasons stickyReasons cordonReason allocation { shardId replicaId }
           recommendedAction taints { key value effect source reason } }
    weights { path state sizeBytes totalBytes pinnedBy }
  }
}`;
const XIDS_QUERY = `query DashboardXids($id: ID!, $since: DateTime, $after: ID) {
  events(nodeId: $id, kinds: ["gpu_xid"], since: $since, after: $after) { id at reason detail }
}`;
// Placement groups (prefill and decode replicas placed as one unit): one page
// of the server's size, and the chosen one's KV paths.
const GROUPS_QUERY = `query DashboardGroups {
  groups {
    groupId generation
    members { role replicaId allocations { nodeId gpuIndices } }
    kvPaths { from to kind }
  }
}`;
// Tenants (issue 46): each one's use of every class against its guarantee and limit.
const TENANTS_QUERY = `query DashboardTenants {
  tenants { id usage { gpuClass used borrowed guaranteed limit available } notices }
}`;
// The next 48 hours per node (issue 47): what is booked on each node, as bars on one time axis.
const TIMELINE_MS = 48 * 3600 * 1000;
const MAINTENANCE_QUERY = `query DashboardMaintenance($after: ID) {
  maintenanceWindows(after: $after) { id nodeIds start end reason state }
}`;
const RESERVATIONS_QUERY = `query DashboardReservations($after: ID) {
  reservations(after: $after) { id tenant start end state gpus { nodeId gpuIndices } }
}`;
// Where each kind of booking joins the timeline: a paged list refresh() reads whole (its query
// takes $after), and how each entry becomes items {nodeId, kind, id, start, end, label}
// (end null: until released).
const TIMELINE_SOURCES = [
  {
    query: MAINTENANCE_QUERY,
    field: "maintenanceWindows",
    items: (entries) =>
      entries
        .filter((w) => w.state !== "DONE" && w.state !== "CANCELLED")
        .flatMap((w) =>
          w.nodeIds.map((nodeId) => ({
            nodeId,
            kind: "maintenance",
            id: w.id,
            start: w.start,
            end: w.end,
            label: `maintenance ${w.id} (${w.state}): ${w.reason}`,
          })),
        ),
  },
  {
    query: RESERVATIONS_QUERY,
    field: "reservations",
    items: (entries) =>
      entries
        .filter((r) => r.state !== "ENDED")
        .flatMap((r) =>
          r.gpus.map((g) => ({
            nodeId: g.nodeId,
            kind: "reservation",
            id: r.id,
            start: r.start,
            end: r.end,
            label: `reservation ${r.id} (${r.state}) for ${r.tenant}: GPUs ${g.gpuIndices.join(",")}`,
          })),
        ),
  },
];
const XID_WINDOW_MS = 24 * 3600 * 1000;
const XIDS_SHOWN = 50;
const SUBSCRIPTIONS_QUERY = `query DashboardSubscriptions {
  __schema { subscriptionType { fields { name args { name type { kind } }
    type { kind ofType { kind ofType { kind ofType { kind } } } } } } }
}`;

const view = {
  nodes: [],
  summary: [],
  fabrics: [],
  groups: [],
  tenants: [],
  timeline: [], // items of TIMELINE_SOURCES, every kind together
  selectedGroup: null, // the placement group whose view is open
  selected: null, // the node whose view is open
  selectedNode: null, // its answer to NODE_QUERY
  skewMs: 0, // server clock minus browser clock
  mode: "loading",
  // Why the page is not live (polling, or still connecting), shown in the badge.
  whyNotLive: "reading the cluster",
  error: null,
  // Whether the nodes were ever read, and whether the last read was refused
  // for want of a token: "Nodes (0)" then would read as an empty cluster.
  read: false,
  needsToken: false,
};

let refreshTimer = null;
let refreshing = null;
let refreshAgain = false;

function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

class GraphQLError extends Error {}

// The service's refusal names GraphiQL's Headers pane; on this page the token
// goes into its own Token field, so the hint says that instead.
function refusal(errors) {
  const refused = errors.find((e) => e.extensions && e.extensions.code === "UNAUTHENTICATED");
  if (!refused) return null;
  view.needsToken = true;
  document.getElementById("token-form").classList.add("needs-token");
  if (!token()) return "this service requires a token: paste one into the Token field above and press Use";
  return `the token in the Token field was refused (${refused.message}): paste another and press Use`;
}

// The answer's data, or a GraphQLError for any error in it, except that a
// list which stopped short (PAGE_TRUNCATED, with the cursor that continues)
// is handed to `truncated`, when given, for the caller to read on from.
async function graphql(query, variables, truncated) {
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(GRAPHQL, {
    method: "POST",
    headers,
    body: JSON.stringify({ query, variables: variables || {} }),
  });
  const date = response.headers.get("Date");
  if (date) view.skewMs = Date.parse(date) - Date.now();
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    throw new GraphQLError(`${response.status} ${response.statusText}`);
  }
  const errors = (body.errors || []).filter((e) => {
    if (truncated && e.extensions && e.extensions.code === "PAGE_TRUNCATED") {
      truncated.push(e.extensions.after);
      return false;
    }
    return true;
  });
  if (errors.length) {
    throw new GraphQLError(refusal(errors) || errors.map((e) => e.message).join("; "));
  }
  view.needsToken = false;
  document.getElementById("token-form").classList.remove("needs-token");
  if (!response.ok) throw new GraphQLError(`${response.status} ${response.statusText}`);
  return body.data;
}

async function loadAllNodes() {
  // Pages of the server's own maximum size: each one that stopped short
  // says so (PAGE_TRUNCATED) and where the next one starts.
  const all = [];
  let after = null;
  for (;;) {
    const truncated = [];
    const data = await graphql(NODES_QUERY, { after }, truncated);
    all.push(...data.nodes);
    if (!truncated.length) return all;
    after = truncated[0];
  }
}

// Every entry of a paged list whose query takes $after, page by page (as loadAllNodes).
async function loadAll(query, field) {
  const all = [];
  let after = null;
  for (;;) {
    const truncated = [];
    const data = await graphql(query, { after }, truncated);
    all.push(...data[field]);
    if (!truncated.length) return all;
    after = truncated[0];
  }
}

// The node and its latest XIDs since `since` (events come oldest first, in pages).
async function loadNodeView(id, since) {
  const data = await graphql(NODE_QUERY, { id });
  const xids = [];
  let after = null;
  for (;;) {
    const truncated = [];
    const page = await graphql(XIDS_QUERY, { id, since, after }, truncated);
    xids.push(...page.events);
    xids.splice(0, Math.max(0, xids.length - XIDS_SHOWN));
    if (!truncated.length) return { node: data.node, events: xids };
    after = truncated[0];
  }
}

async function refresh() {
  if (refreshing) {
    // Events arrive in bursts: one more read after the current one covers them all.
    refreshAgain = true;
    return refreshing;
  }
  refreshing = (async () => {
    do {
      refreshAgain = false;
      try {
        const since = new Date(Date.now() + view.skewMs - XID_WINDOW_MS).toISOString();
        const [nodes, summary, selected, groups, tenants, timeline] = await Promise.all([
          loadAllNodes(),
          graphql(SUMMARY_QUERY),
          view.selected ? loadNodeView(view.selected, since) : null,
          graphql(GROUPS_QUERY),
          graphql(TENANTS_QUERY),
          Promise.all(TIMELINE_SOURCES.map(async (s) => s.items(await loadAll(s.query, s.field)))),
        ]);
        view.timeline = timeline.flat();
        view.selectedNode = selected;
        view.groups = groups.groups;
        view.tenants = tenants.tenants;
        view.nodes = nodes;
        view.summary = summary.gpuClasses;
        view.fabrics = summary.fabrics.map((f) => f.name);
        view.read = true;
        view.error = null;
      } catch (error) {
        view.error = error.message;
      }
      render();
    } while (refreshAgain);
  })();
  try {
    await refreshing;
  } finally {
    refreshing = null;
  }
}

function schedule(ms) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(async () => {
    await refresh();
    schedule(view.mode === "live" ? SAFETY_POLL_MS : POLL_MS);
  }, ms);
}

// ---- live updates: graphql-transport-ws, the protocol Strawberry speaks ----

function namedKind(type) {
  while (type && (type.kind === "NON_NULL" || type.kind === "LIST")) type = type.ofType;
  return type ? type.kind : null;
}

// The subscription to follow ({query}), or why there is none ({why}): the page then polls.
async function eventsSubscription() {
  let data;
  try {
    data = await graphql(SUBSCRIPTIONS_QUERY);
  } catch (error) {
    return { why: `the schema could not be read (${error.message})` };
  }
  const type = data.__schema.subscriptionType;
  const field = type && type.fields.find((f) => f.name === "events");
  if (!field) return { why: "this service offers no events subscription" };
  if (field.args.some((a) => a.type.kind === "NON_NULL")) {
    return { why: "the events subscription needs arguments this page does not know" };
  }
  const kind = namedKind(field.type);
  const selection = kind === "SCALAR" || kind === "ENUM" ? "" : " { __typename }";
  return { query: `subscription DashboardEvents { events${selection} }` };
}

// Why a websocket closed, in words an operator can act on.
function closedBecause(event, said) {
  if (said) return `the subscription was refused: ${said}`;
  if (event.code === 4403) return "the subscription's token was refused (code 4403): check the Token field";
  if (event.code === 1012) return "the service restarted (code 1012)";
  if (event.code === 1006) return "the websocket was cut or never opened (a proxy that does not pass websockets?)";
  return `the websocket closed (code ${event.code}${event.reason ? `: ${event.reason}` : ""})`;
}

// A websocket that neither opens nor closes (a proxy holding the upgrade) must not
// leave the page saying "connecting" for ever.
const CONNECT_TIMEOUT_MS = 10000;

let socket = null;
let retryMs = 1000;

function connectLive(query) {
  if (socket) return; // one subscription per page, whoever asks for it
  const url = new URL(GRAPHQL);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  socket = new WebSocket(url, "graphql-transport-ws");
  const opening = socket;
  let said = null;
  let acknowledged = false;
  setMode("connecting", "opening the events subscription");
  setTimeout(() => {
    if (socket === opening && !acknowledged) {
      said = `no answer on the websocket within ${CONNECT_TIMEOUT_MS / 1000}s`;
      opening.close();
    }
  }, CONNECT_TIMEOUT_MS);
  socket.onopen = () => {
    const payload = token() ? { Authorization: `Bearer ${token()}` } : {};
    socket.send(JSON.stringify({ type: "connection_init", payload }));
  };
  socket.onmessage = (message) => {
    const msg = JSON.parse(message.data);
    if (msg.type === "connection_ack") {
      acknowledged = true;
      socket.send(JSON.stringify({ id: "events", type: "subscribe", payload: { query } }));
      retryMs = 1000;
      setMode("live");
      refresh(); // anything that changed before the subscription started
    } else if (msg.type === "next") {
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(() => {
        refresh();
        schedule(SAFETY_POLL_MS);
      }, 200);
    } else if (msg.type === "ping") {
      socket.send(JSON.stringify({ type: "pong" }));
    } else if (msg.type === "error" || msg.type === "complete") {
      const errors = Array.isArray(msg.payload) ? msg.payload : [];
      said = errors.map((e) => e.message).join("; ") || (msg.type === "complete" ? "the service ended it" : "an error");
      socket.close();
    }
  };
  socket.onclose = (event) => {
    socket = null;
    // Poll while the subscription is down; try it again with backoff.
    setMode("polling", `${closedBecause(event, said)}; retrying in ${Math.round(retryMs / 1000)}s`);
    schedule(POLL_MS);
    setTimeout(() => connectLive(query), retryMs);
    retryMs = Math.min(retryMs * 2, 30000);
  };
}

function setMode(mode, whyNotLive) {
  view.mode = mode;
  view.whyNotLive = mode === "live" ? null : whyNotLive || view.whyNotLive;
  renderStatus();
}

// ---- rendering ----

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function formatBytes(bytes) {
  // Decimal units, as disks are sold.
  const units = ["B", "kB", "MB", "GB", "TB", "PB"];
  let value = Number(bytes);
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  const digits = value >= 100 || unit === 0 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

function formatAge(lastSeen) {
  const seconds = Math.max(0, Math.round((Date.now() + view.skewMs - Date.parse(lastSeen)) / 1000));
  if (seconds < 60) return `${seconds}s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ago`;
  return `${Math.floor(seconds / 86400)}d ago`;
}

// Free as the service says (Node.freeGpus): the rule lives in service/availability.py only.
function gpuCounts(node) {
  const byClass = new Map();
  const count = (cls) => byClass.get(cls) || byClass.set(cls, { free: 0, total: 0 }).get(cls);
  for (const gpu of node.gpus) count(gpu.gpuClass).total += 1;
  for (const gpu of node.freeGpus || []) count(gpu.gpuClass).free += 1;
  return [...byClass.entries()].sort(([a], [b]) => a.localeCompare(b));
}

function filters() {
  return {
    state: document.getElementById("filter-state").value,
    gpuClass: document.getElementById("filter-class").value,
    fabric: document.getElementById("filter-fabric").value,
  };
}

function visible(node, f) {
  if (f.state && node.state !== f.state) return false;
  if (f.gpuClass && !node.gpus.some((g) => g.gpuClass === f.gpuClass)) return false;
  if (f.fabric && !node.fabrics.some((a) => a.fabric === f.fabric)) return false;
  return true;
}

function setOptions(select, values) {
  // Keeps the current choice, even one that has (for now) disappeared.
  const current = select.value;
  const wanted = ["", ...new Set([...values, current].filter(Boolean))];
  const have = [...select.options].map((o) => o.value);
  if (wanted.join("\n") === have.join("\n")) return;
  select.replaceChildren(...wanted.map((v) => el("option", { value: v }, v || "all")));
  select.value = current;
}

function renderStatus() {
  const status = document.getElementById("status");
  if (view.error) {
    status.className = "status error";
    status.textContent = view.error;
  } else {
    // Every branch sets the text: a stale error must not outlive the answer that fixed it.
    status.className = `status ${view.mode}`;
    status.textContent =
      view.mode === "live"
        ? "live"
        : view.mode === "polling"
          ? `polling every ${POLL_MS / 1000}s: ${view.whyNotLive}`
          : `connecting: ${view.whyNotLive}…`;
  }
  status.title = status.textContent;
}

function renderSummary() {
  const body = document.querySelector("#summary tbody");
  body.replaceChildren(
    ...view.summary.map((s) =>
      el(
        "tr",
        { "data-gpu-class": s.gpuClass },
        el("td", {}, s.gpuClass),
        el("td", { class: "num" }, s.total),
        el("td", { class: "num free" }, s.free),
        el("td", { class: "num" }, s.allocated),
        el("td", { class: "num" }, s.unhealthy),
        el("td", { class: "num" }, s.unschedulable),
      ),
    ),
  );
}

function nodeRow(node) {
  const disk = node.localDisk
    ? el("td", { class: "disk num" }, `${formatBytes(node.localDisk.freeBytes)} / ${formatBytes(node.localDisk.totalBytes)}`)
    : el("td", { class: "disk num unknown", title: "unknown: the agent reported no local filesystem" }, "—");
  const reason = node.stateReason
    ? [node.stateReason, node.stateChangedBy ? el("span", { class: "muted" }, ` · by ${node.stateChangedBy}`) : ""]
    : [""];
  const gpus = gpuCounts(node);
  return el(
    "tr",
    { "data-node-id": node.id },
    el(
      "td",
      { class: "node" },
      el("a", { href: `#node=${encodeURIComponent(node.id)}`, class: "open-node" }, node.id),
      el("div", { class: "hostname" }, node.hostname),
    ),
    el("td", {}, el("span", { class: `state state-${node.state}` }, node.state)),
    el("td", { class: "reason" }, ...reason, ...nodeMarks(node)),
    el(
      "td",
      { class: "gpus" },
      ...(gpus.length
        ? gpus.map(([cls, c]) =>
            node.schedulable
              ? el("div", {}, `${c.free} / ${c.total} ${cls}`)
              : // Idle GPUs on a node that is not READY are not free for the schedulers.
                el("div", { class: "unschedulable", title: `not schedulable: the node is ${node.state}` }, `${c.free} / ${c.total} ${cls}`),
          )
        : [el("span", { class: "unknown" }, "none")]),
      ...gpuMarks(node),
    ),
    el("td", { class: "fabrics" }, node.fabrics.map((f) => f.fabric).join(", ") || "—"),
    disk,
    el("td", { class: "age", "data-last-seen": node.lastSeen }, formatAge(node.lastSeen)),
    nvlinkCell(node),
  );
}

// The node's NVLink groups ("NVLink 8", "NVLink 2x4", "none") and the widest
// tensor-parallel shard it can take now; unknown topology is said, not zeroed.
function nvlinkCell(node) {
  const largest = node.largestFreeNvlinkGroup;
  return el(
    "td",
    { class: node.nvlinkGroups === "unknown" ? "nvlink unknown" : "nvlink" },
    node.nvlinkGroups,
    largest === null ? "" : el("div", { class: "muted" }, `largest free ${largest}`),
  );
}

// Unhealthy GPUs, cordoned ones, those whose health waits for a reset, and
// those fleet health marks (below), marked under the counts: the GPUs the
// summary counts as unhealthy, found by node.
function gpuMarks(node) {
  return node.gpus
    .filter((g) => g.cordonReason || g.stickyReasons.length || !g.healthy || healthMarks(node, g).length)
    .map((g) => {
      const passing = g.healthReasons.filter((r) => !g.stickyReasons.includes(r));
      const marks = healthMarks(node, g);
      const tainted = ownTaints(g.taints, GPU_TAINTS_SHOWN_ELSEWHERE).length && "tainted";
      const kinds = [!g.healthy && "unhealthy", g.cordonReason && "cordoned", g.stickyReasons.length && "sticky", tainted];
      return el(
        "div",
        { class: ["gpu-mark", ...kinds.filter(Boolean)].join(" "), "data-gpu-index": g.index },
        `GPU ${g.index} `,
        ...passing.map((r) => el("span", { class: "unhealthy", title: "unhealthy: reported by the node's agent" }, r)),
        ...g.stickyReasons.map((r) => el("span", { class: "sticky", title: "unhealthy until the GPU is reset" }, r)),
        ...(g.cordonReason ? [el("span", { class: "cordoned", title: g.cordonReason }, "cordoned")] : []),
        ...marks,
      );
    });
}

// ---- fleet health's marks (docs/operations/dashboard.md) ----
// Each reads as words (what, its effect or state, who or what set it, why);
// colour only repeats what the words say.

// A cordon or drain is also a taint (keys cordon and drain, Taint's
// description in the schema): the node's state and the GPU's cordoned mark
// say so already.
const NODE_TAINTS_SHOWN_ELSEWHERE = ["cordon", "drain"];
const GPU_TAINTS_SHOWN_ELSEWHERE = ["cordon"];

function ownTaints(taints, shownElsewhere) {
  return (taints || []).filter((t) => !shownElsewhere.includes(t.key));
}

function taintMark(t) {
  return el(
    "div",
    { class: `mark taint effect-${t.effect}` },
    el("span", { class: "mark-kind" }, "taint"),
    ` ${t.key}${t.value === null || t.value === undefined ? "" : `=${t.value}`} `,
    el("span", { class: "effect" }, t.effect),
    ` by ${t.source}: ${t.reason}`,
  );
}

// An open remediation: its action and state, and what set it off (xid-79,
// drift-gpu-missing: also its taint's key).
function remediationMark(r, gpus) {
  return el(
    "div",
    { class: `mark remediation state-${r.state}`, "data-remediation-id": r.id },
    el("span", { class: "mark-kind" }, "remediation"),
    ` ${r.action} `,
    el("span", { class: "remediation-state" }, r.state),
    `: ${r.trigger}${gpus ? ` (GPUs ${r.gpuIndices.join(", ")})` : ""}`,
  );
}

// A remediation of the whole node (scope NODE), or of GPUs the node no longer
// reports, is the node's mark; the others are marks of the GPUs they name.
function onNode(node, r) {
  return r.scope === "NODE" || !r.gpuIndices.some((i) => node.gpus.some((g) => g.index === i));
}

// The GPU's own taints, what the remediation policy recommends for it, and the
// node's open remediations that name it.
function healthMarks(node, g) {
  const remediations = (node.remediations || []).filter((r) => !onNode(node, r) && r.gpuIndices.includes(g.index));
  return [
    ...ownTaints(g.taints, GPU_TAINTS_SHOWN_ELSEWHERE).map(taintMark),
    ...(g.recommendedAction && g.recommendedAction !== "NONE"
      ? [el("div", { class: "mark recommended" }, el("span", { class: "mark-kind" }, "recommended"), ` ${g.recommendedAction}`)]
      : []),
    ...remediations.map((r) => remediationMark(r, false)),
  ];
}

// The node's own taints, its drift from its hardware profile, and its own
// open remediations (onNode).
function nodeMarks(node) {
  return [
    ...ownTaints(node.taints, NODE_TAINTS_SHOWN_ELSEWHERE).map(taintMark),
    ...(node.drift || []).map((d) =>
      el(
        "div",
        { class: "mark drift" },
        el("span", { class: "mark-kind" }, "drift"),
        ` ${d.kind}: expected ${d.expected}, observed ${d.observed}`,
        d.gpuIndices ? ` (GPUs ${d.gpuIndices.join(", ")})` : "",
      ),
    ),
    ...(node.remediations || []).filter((r) => onNode(node, r)).map((r) => remediationMark(r, true)),
  ].map((mark) => {
    mark.classList.add("node-mark");
    return mark;
  });
}

function renderNodeView() {
  const section = document.getElementById("node-view");
  const node = view.selectedNode && view.selectedNode.node;
  section.hidden = !view.selected;
  if (!view.selected) return;
  document.getElementById("node-view-title").textContent = node ? node.id : `${view.selected} (not registered)`;
  const gpus = node ? node.gpus : [];
  const marks = node ? nodeMarks(node) : [];
  document.getElementById("node-marks").replaceChildren(...marks);
  document.getElementById("node-marks").hidden = marks.length === 0;
  document.querySelector("#node-gpus tbody").replaceChildren(
    ...gpus.map((g) => {
      const health = healthMarks(node, g);
      return el(
        "tr",
        { "data-gpu-index": g.index },
        el("td", { class: "num" }, g.index),
        el("td", {}, g.gpuClass),
        el("td", { class: g.healthy ? "" : "unhealthy" }, g.healthy ? "ok" : g.healthReasons.join(", ")),
        el("td", { class: "sticky" }, g.stickyReasons.join(", ") || "—"),
        el("td", { class: "cordoned" }, g.cordonReason || "—"),
        el("td", {}, g.allocation ? `${g.allocation.shardId} (replica ${g.allocation.replicaId})` : "—"),
        el("td", { class: "marks" }, ...(health.length ? health : ["—"])),
      );
    }),
  );
  renderNodeWeights(node ? node.weights : []);
  const xids = view.selectedNode ? [...view.selectedNode.events].reverse() : [];
  document.querySelector("#node-xids tbody").replaceChildren(
    ...xids.map((e) =>
      el(
        "tr",
        { "data-event-id": e.id },
        el("td", { class: "age", "data-last-seen": e.at }, formatAge(e.at)),
        el("td", { class: "num" }, e.detail.index),
        el("td", { class: "num xid" }, e.detail.xid),
        el("td", {}, e.detail.critical ? e.reason : "the application's (the GPU stays healthy)"),
      ),
    ),
  );
  document.getElementById("node-xids-none").hidden = xids.length > 0;
}

// The node's weights: where each download stands and which replicas pin it
// (docs/scheduler/weights.md).
function renderNodeWeights(weights) {
  document.querySelector("#node-weights tbody").replaceChildren(
    ...weights.map((w) => {
      const partial = w.totalBytes && w.sizeBytes !== null && w.sizeBytes !== w.totalBytes;
      const size = partial
        ? `${formatBytes(w.sizeBytes)} of ${formatBytes(w.totalBytes)} (${Math.floor((100 * w.sizeBytes) / w.totalBytes)}%)`
        : formatBytes(w.sizeBytes ?? w.totalBytes);
      return el(
        "tr",
        { "data-path": w.path },
        el("td", {}, w.path),
        el("td", { class: `weights-${(w.state || "unknown").toLowerCase()}` }, (w.state || "unknown").toLowerCase()),
        el("td", { class: "num" }, size),
        el("td", {}, w.pinnedBy.join(", ") || "—"),
      );
    }),
  );
  document.getElementById("node-weights-none").hidden = weights.length > 0;
}

// Where a member is, as a person reads it: node:GPUs per shard, or released.
function memberPlace(member) {
  if (!member.allocations.length) return "released";
  return member.allocations.map((a) => `${a.nodeId}:${a.gpuIndices.join(",")}`).join(" ");
}

function renderGroups() {
  document.getElementById("groups-none").hidden = view.groups.length > 0;
  document.querySelector("#groups tbody").replaceChildren(
    ...view.groups.map((g) => {
      const roles = {};
      for (const m of g.members) roles[m.role] = (roles[m.role] || 0) + 1;
      const nodes = new Set(g.members.flatMap((m) => m.allocations.map((a) => a.nodeId)));
      return el(
        "tr",
        { "data-group-id": g.groupId },
        el("td", {}, el("a", { href: "#", class: "open-group" }, g.groupId)),
        el("td", { class: "num" }, g.generation),
        el("td", {}, Object.entries(roles).map(([r, n]) => `${r}: ${n}`).join(", ")),
        el("td", {}, [...nodes].sort().join(", ") || "—"),
      );
    }),
  );
  const section = document.getElementById("group-view");
  const group = view.groups.find((g) => g.groupId === view.selectedGroup);
  section.hidden = !view.selectedGroup;
  if (!view.selectedGroup) return;
  document.getElementById("group-view-title").textContent = group ? group.groupId : `${view.selectedGroup} (not placed)`;
  document.querySelector("#group-members tbody").replaceChildren(
    ...(group ? group.members : []).map((m) =>
      el("tr", { "data-replica-id": m.replicaId }, el("td", {}, m.role), el("td", {}, m.replicaId), el("td", {}, memberPlace(m))),
    ),
  );
  const paths = group ? group.kvPaths : [];
  document.querySelector("#group-paths tbody").replaceChildren(
    ...paths.map((p) =>
      el("tr", {}, el("td", {}, p.from), el("td", {}, p.to), el("td", { class: `path-${p.kind.toLowerCase()}` }, p.kind.toLowerCase().replaceAll("_", " "))),
    ),
  );
  document.getElementById("group-paths-none").hidden = paths.length > 0;
}

// One class of a tenant as a bar: held within the guarantee, borrowed beyond
// it, the room left under the limit (or, without one, what it could get now),
// and a mark where the guarantee ends.
function usageBar(u) {
  const span = Math.max(u.limit ?? u.used + u.available, u.used, 1);
  const pct = (n) => `${(100 * n) / span}%`;
  const within = Math.min(u.used, u.guaranteed);
  const over = u.limit !== null && u.used > u.limit;
  return el(
    "div",
    { class: over ? "usage-bar over" : "usage-bar", title: `${u.used} held, ${u.guaranteed} guaranteed, limit ${u.limit ?? "none"}` },
    el("span", { class: "within", style: `width: ${pct(within)}` }),
    el("span", { class: "borrowed", style: `width: ${pct(u.used - within)}` }),
    el("span", { class: "guarantee", style: `left: ${pct(Math.min(u.guaranteed, span))}` }),
  );
}

function renderTenants() {
  const rows = view.tenants.flatMap((t) =>
    t.usage.map((u) =>
      el(
        "tr",
        { "data-tenant": t.id, "data-gpu-class": u.gpuClass },
        el("td", {}, t.id),
        el("td", {}, u.gpuClass),
        el("td", { class: "num" }, `${u.used} / ${u.limit ?? "no limit"}`),
        el("td", { class: "num" }, u.guaranteed),
        el("td", { class: "num" }, u.borrowed),
        el("td", { class: "num" }, u.available),
        el("td", {}, usageBar(u)),
      ),
    ),
  );
  document.querySelector("#tenants tbody").replaceChildren(...rows);
  document.getElementById("tenants-none").hidden = rows.length > 0;
  document.getElementById("tenant-notices").replaceChildren(
    ...view.tenants.flatMap((t) => t.notices.map((n) => el("li", {}, `${t.id}: ${n}`))),
  );
}

// One row per node with something booked in the next 48 hours; each booking a bar placed on
// the axis by the server's clock (view.skewMs), clipped to the window shown.
function renderTimeline() {
  const now = Date.now() + view.skewMs;
  const ahead = now + TIMELINE_MS;
  const byNode = new Map();
  for (const item of view.timeline) {
    const start = Date.parse(item.start);
    const end = item.end === null ? Infinity : Date.parse(item.end);
    if (end <= now || start >= ahead) continue;
    if (!byNode.has(item.nodeId)) byNode.set(item.nodeId, []);
    byNode.get(item.nodeId).push({ ...item, from: Math.max(start, now), to: Math.min(end, ahead) });
  }
  const pct = (ms) => `${((100 * ms) / TIMELINE_MS).toFixed(3)}%`;
  const rows = [...byNode.keys()].sort().map((nodeId) =>
    el(
      "tr",
      { "data-node": nodeId },
      el("td", {}, nodeId),
      el(
        "td",
        {},
        el(
          "div",
          { class: "timeline-track" },
          ...byNode.get(nodeId).map((b) =>
            el("span", {
              class: `booking ${b.kind}`,
              "data-id": b.id,
              title: `${b.label}: ${b.start} to ${b.end ?? "until released"}`,
              style: `left: ${pct(b.from - now)}; width: ${pct(b.to - b.from)}`,
            }),
          ),
        ),
      ),
    ),
  );
  document.querySelector("#timeline tbody").replaceChildren(...rows);
  document.getElementById("timeline-none").hidden = rows.length > 0;
}

function render() {
  renderStatus();
  renderSummary();
  renderNodeView();
  renderGroups();
  renderTenants();
  renderTimeline();
  setOptions(document.getElementById("filter-state"), STATES);
  setOptions(document.getElementById("filter-class"), view.summary.map((s) => s.gpuClass));
  setOptions(document.getElementById("filter-fabric"), view.fabrics);
  const f = filters();
  const shown = view.nodes.filter((n) => visible(n, f));
  document.querySelector("#nodes tbody").replaceChildren(...shown.map(nodeRow));
  document.getElementById("count").textContent = nodeCount(shown);
  document.body.dataset.loaded = "true";
}

// "(5)", "(2 of 5)", or why there is no number to show.
function nodeCount(shown) {
  if (view.needsToken) return view.read ? "(as last read; a token is needed)" : "(a token is needed to read them)";
  if (!view.read) return view.error ? "(not read: see the status above)" : "(reading)";
  return shown.length === view.nodes.length ? `(${view.nodes.length})` : `(${shown.length} of ${view.nodes.length})`;
}

function renderAges() {
  for (const cell of document.querySelectorAll("td.age")) {
    cell.textContent = formatAge(cell.dataset.lastSeen);
  }
}

// ---- filters in the URL, so a filtered view can be shared ----

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  view.selected = params.get("node") || null;
  view.selectedGroup = params.get("group") || null;
  for (const [id, key] of [["filter-state", "state"], ["filter-class", "class"], ["filter-fabric", "fabric"]]) {
    const value = params.get(key) || "";
    const select = document.getElementById(id);
    if (value && ![...select.options].some((o) => o.value === value)) select.append(el("option", { value }, value));
    select.value = value;
  }
}

function writeHash() {
  const f = filters();
  const params = new URLSearchParams();
  if (f.state) params.set("state", f.state);
  if (f.gpuClass) params.set("class", f.gpuClass);
  if (f.fabric) params.set("fabric", f.fabric);
  if (view.selected) params.set("node", view.selected);
  if (view.selectedGroup) params.set("group", view.selectedGroup);
  history.replaceState(null, "", params.toString() ? `#${params}` : location.pathname + location.search);
}

async function start() {
  document.getElementById("token").value = token();
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = document.getElementById("token").value.trim();
    if (value) localStorage.setItem(TOKEN_KEY, value);
    else localStorage.removeItem(TOKEN_KEY);
    if (socket) socket.close(); // reconnects with the new token
    else if (view.mode !== "live") goLive(); // the schema may have been refused without one
    refresh();
  });
  document.getElementById("filters").addEventListener("change", () => {
    writeHash();
    render();
  });
  document.getElementById("nodes").addEventListener("click", (event) => {
    const link = event.target.closest("a.open-node");
    if (!link) return;
    event.preventDefault();
    view.selected = link.closest("tr").dataset.nodeId;
    view.selectedNode = null;
    writeHash();
    refresh();
  });
  document.getElementById("groups").addEventListener("click", (event) => {
    const link = event.target.closest("a.open-group");
    if (!link) return;
    event.preventDefault();
    view.selectedGroup = link.closest("tr").dataset.groupId;
    writeHash();
    render();
  });
  document.getElementById("close-group").addEventListener("click", () => {
    view.selectedGroup = null;
    writeHash();
    render();
  });
  document.getElementById("close-node").addEventListener("click", () => {
    view.selected = null;
    view.selectedNode = null;
    writeHash();
    render();
  });
  readHash();
  setInterval(renderAges, 1000);
  await refresh();
  await goLive();
}

async function goLive() {
  // One subscription per page: the look started before the token was typed
  // in may end after the one made with it opened the subscription, and must
  // neither say "connecting" nor "polling" over it.
  if (socket) return;
  setMode("connecting", "looking for the events subscription");
  const subscription = await eventsSubscription();
  if (socket) return;
  if (subscription.query) {
    connectLive(subscription.query);
  } else {
    setMode("polling", subscription.why);
    schedule(POLL_MS);
  }
}

start();
