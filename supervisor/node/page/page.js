// Warren's management page. Every POLL_MS it asks the node for its JSON pages (PAGES), all
// at once; when they answer it redraws the page, and keeps the readings of the last
// HISTORY_MS, from which it computes the rates (the API gives counters: a rate is the
// growth of a counter between two readings over the time between them) and draws the
// charts as inline SVG. When a poll fails or times out, the header turns red, a banner
// says since when the node has not answered, the figures are greyed as stale, and polling
// goes on; the first answer after that clears it. Read-only: it only ever sends GETs.
// Two views, by the address's fragment: the node's (sections reached by #connections,
// #queues ...) and one queue's or stream's (#/queue/NAME), redrawn from the last answers
// as soon as the fragment changes. Everything the node names (queues, streams, exchanges,
// actors) is written as text, never as HTML.
"use strict";

const POLL_MS = 3000; // how often the node is asked
const TIMEOUT_MS = 2500; // a poll unanswered this long counts as the node not answering
const HISTORY_MS = 5 * 60 * 1000; // what the charts show, and the readings kept
const GAP_MS = 3 * POLL_MS; // readings further apart than this are not joined by a line
const SVG = "http://www.w3.org/2000/svg"; // the namespace of SVG elements, not a fetch
const QUEUE_VIEW = "#/queue/"; // the fragment of a queue's view, before its name
const TREE_FOLDED_FROM = 12; // a supervisor with this many children starts folded
const PAGES = ["overview", "queues", "tree", "connections", "exchanges", "bindings"];

const NODE_RATES = [
  ["published", "global_messages_routed_total"],
  ["confirmed", "global_messages_confirmed_total"],
  ["delivered", "global_messages_delivered_total"],
  ["acknowledged", "global_messages_acknowledged_total"],
];
const NODE_DEPTHS = [
  ["ready", "messages_ready"],
  ["unacked", "messages_unacked"],
];
const QUEUE_RATES = [
  ["published", "messages_published_total"],
  ["confirmed", "messages_confirmed_total"],
  ["delivered", "messages_delivered_total"],
  ["acknowledged", "messages_acknowledged_total"],
];
const VARIABLE_QUEUE_STATES = [
  ["α", "alpha", "body and index in RAM"],
  ["β", "beta", "index in RAM, body on disk"],
  ["γ", "gamma", "index in RAM and on disk"],
  ["δ", "delta", "on disk only"],
];

const readings = []; // {at, overview, queues: Map name -> document}, oldest first
let latest = null; // the last answers, by page
let notAnsweringSince = null; // the time of the first failed poll since the last answer
const unfolded = new Set(); // the supervisors whose folded children the user opened

function $(id) {
  return document.getElementById(id);
}

// An element with attributes and children (strings become text nodes).
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

function svg(tag, attributes = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

// A table cell cut with an ellipsis when too long: the whole text is its title.
function cell(text, className = "", ...children) {
  const attributes = { title: text };
  if (className) attributes.class = className;
  return el("td", attributes, ...(children.length ? children : [text]));
}

function numberCell(text, className = "") {
  return el("td", { class: `n ${className}`.trim() }, text);
}

function clock(time) {
  const two = (n) => String(n).padStart(2, "0");
  return `${two(time.getHours())}:${two(time.getMinutes())}:${two(time.getSeconds())}`;
}

function count(value) {
  if (value === null || value === undefined) return "–";
  return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(1);
}

// A figure on a chart's axis: short (1.5k, 20k, 3M).
function compact(value) {
  for (const [size, suffix] of [
    [1e9, "G"],
    [1e6, "M"],
    [1e3, "k"],
  ]) {
    if (value >= size) return `${Number((value / size).toFixed(1))}${suffix}`;
  }
  return String(Number(value.toFixed(1)));
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

function counted(n, noun) {
  return `${count(n)} ${noun}${n === 1 ? "" : "s"}`;
}

function duration(seconds) {
  const s = Math.floor(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function rate(value) {
  if (value === null) return "–";
  return value >= 100 ? Math.round(value).toLocaleString("en-US") : value.toFixed(1);
}

// Per second, from the last two readings; null without two, across a gap, or when the
// counter went back (the node was restarted).
function rateOf(pick) {
  if (readings.length < 2) return null;
  const [before, now] = readings.slice(-2);
  if (now.at - before.at > GAP_MS) return null;
  const a = pick(before);
  const b = pick(now);
  if (typeof a !== "number" || typeof b !== "number" || b < a) return null;
  return (b - a) / ((now.at - before.at) / 1000);
}

async function getJson(path) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
  try {
    const response = await fetch(path, { signal: abort.signal, cache: "no-store" });
    if (!response.ok) throw new Error(`${path} answered ${response.status}`);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

// The next poll is due whatever this one met; a fault in drawing is the page's own (in
// the browser's console), never taken for the node not answering.
async function poll() {
  let answers = null;
  try {
    answers = await Promise.all(PAGES.map((page) => getJson(`api/${page}`)));
  } catch (error) {
    notAnswering(error);
  }
  setTimeout(poll, POLL_MS);
  if (answers !== null) answered(Object.fromEntries(PAGES.map((page, i) => [page, answers[i]])));
}

function answered(answers) {
  const at = Date.now();
  latest = answers;
  const queues = new Map(answers.queues.map((q) => [q.name, q]));
  readings.push({ at, overview: answers.overview, queues });
  while (readings[0].at < at - HISTORY_MS) readings.shift();
  if (notAnsweringSince !== null) {
    $("last-outage").textContent =
      `The node did not answer from ${clock(notAnsweringSince)} to ${clock(new Date(at))}.`;
    notAnsweringSince = null;
  }
  $("outage").hidden = true;
  $("header").classList.remove("down");
  for (const view of [$("figures"), $("queue-view")]) view.classList.remove("stale");
  draw();
  $("updated").textContent = `Last answer at ${clock(new Date(at))}.`;
}

function draw() {
  const { overview, queues, tree, connections, exchanges, bindings } = latest;
  const at = readings[readings.length - 1].at;
  drawSummary(overview, tree);
  drawAlarms(overview);
  drawTotals(overview);
  drawStores(overview.stores);
  drawCharts(at);
  drawConnections(connections);
  drawConsumers(queues);
  drawExchanges(exchanges, bindings);
  drawBindings(bindings);
  drawQueues(queues.filter((q) => q.type !== "stream"));
  drawStreams(queues.filter((q) => q.type === "stream"));
  drawTree(tree.tree);
  drawView(at);
}

function notAnswering(error) {
  if (notAnsweringSince === null) notAnsweringSince = new Date();
  const reason =
    error.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : error.message;
  $("outage").textContent =
    `Node not answering since ${clock(notAnsweringSince)} (${reason}); still trying. ` +
    "The figures below are the last it gave.";
  $("outage").hidden = false;
  $("header").classList.add("down");
  for (const view of [$("figures"), $("queue-view")]) view.classList.add("stale");
}

function drawSummary(overview, tree) {
  $("node-name").textContent = overview.node;
  document.title = `Warren ${overview.node}`;
  const unanswered = overview.actors_unanswered.length;
  $("node-summary").replaceChildren(
    el("span", { class: `state-${overview.state}` }, overview.state),
    ` · Warren ${overview.version}`,
    ` · up ${duration(overview.uptime_seconds)}`,
    ` · ${counted(overview.queues - overview.streams, "queue")}`,
    `, ${counted(overview.streams, "stream")}`,
    ` · ${counted(overview.actors_running, "actor")}`,
    `, ${counted(overview.counters.actor_restarts_total, "restart")}`,
    unanswered ? ` · ${unanswered} not answering: ${overview.actors_unanswered.join(", ")}` : "",
    tree.tree === null ? " · the supervision tree is starting" : "",
  );
}

function drawAlarms(overview) {
  const alarms = overview.alarms.map((name) => el("li", { class: "raised" }, `${name} alarm`));
  if (!alarms.length) alarms.push(el("li", { class: "ok" }, "no alarm"));
  $("alarms").replaceChildren(...alarms);
  const r = overview.readings;
  const rows = [];
  if (r.memory_bytes !== undefined) {
    rows.push(
      el("dt", {}, "memory"),
      el(
        "dd",
        {},
        el("meter", { min: 0, max: r.memory_limit_bytes, value: r.memory_bytes }),
        `${bytes(r.memory_bytes)} of ${bytes(r.memory_limit_bytes)}`,
      ),
    );
  }
  if (r.disk_free_bytes !== undefined) {
    rows.push(
      el("dt", {}, "disk free"),
      el("dd", {}, `${bytes(r.disk_free_bytes)} (alarm below ${bytes(r.disk_free_limit_bytes)})`),
    );
  }
  rows.push(el("dt", {}, "started"), el("dd", {}, startedAt(overview)));
  const cluster = overview.cluster;
  if (cluster && cluster.cluster) {
    const epoch = cluster.epoch === null ? "-" : cluster.epoch;
    rows.push(
      el("dt", {}, "cluster"),
      el(
        "dd",
        { "data-cluster": cluster.cluster },
        `${cluster.cluster}: ${cluster.role}; leader ${cluster.leader ?? "none"}, epoch ${epoch}`,
      ),
    );
  }
  $("resources").replaceChildren(...rows);
}

function startedAt(overview) {
  const started = new Date(overview.started_at * 1000);
  return `${started.toLocaleString("en-GB")} (up ${duration(overview.uptime_seconds)})`;
}

// Now in the queues, and since the node started (the counters are the node's).
function drawTotals(overview) {
  const figures = [
    ["ready", count(overview.messages_ready)],
    ["unacked", count(overview.messages_unacked)],
    ["unconfirmed", count(overview.messages_unconfirmed)],
    ["consumers", count(overview.consumers)],
    ...NODE_RATES.map(([name, counter]) => [`${name}, in all`, count(overview.counters[counter])]),
  ];
  if (overview.tcp_connections !== null) {
    figures.push(["tcp connections", count(overview.tcp_connections)]);
  }
  $("totals").replaceChildren(
    ...figures.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]),
  );
}

// One column per store (two of them), one row per figure: it fits the narrowest card.
function drawStores(stores) {
  const names = Object.keys(stores);
  const table = $("stores");
  table.tHead.rows[0].replaceChildren(
    el("th", {}, "store"),
    ...names.map((name) => el("th", { class: "store" }, name.replace("msg_store_", ""))),
  );
  const figures = [
    ["messages", (store) => count(store.messages)],
    ["files", (store) => count(store.files)],
    ["bytes", (store) => bytes(store.bytes)],
    ["garbage", (store) => `${Math.round((store.garbage_ratio ?? 0) * 100)} %`],
  ];
  const rows = figures.map(([figure, shown]) =>
    el(
      "tr",
      {},
      el("th", {}, figure),
      ...names.map((name) => el("td", { class: "n", "data-store": name }, shown(stores[name]))),
    ),
  );
  table.tBodies[0].replaceChildren(...(names.length ? rows : [emptyRow(1, "not answering")]));
}

function drawCharts(now) {
  const rates = NODE_RATES.map(([name, counter]) => [
    name,
    series((r) => r.overview.counters[counter]),
  ]);
  const depths = NODE_DEPTHS.map(([name, key]) => [
    name,
    readings.map((r) => [r.at, r.overview[key]]),
  ]);
  $("charts").replaceChildren(
    chart("Messages per second", rates, now, rate),
    chart("Messages in queues", depths, now, count),
  );
}

// A counter's rate at each reading after the first: [time, per second], null at a gap.
function series(pick) {
  const points = [];
  for (let i = 1; i < readings.length; i += 1) {
    const [a, b] = [pick(readings[i - 1]), pick(readings[i])];
    const seconds = (readings[i].at - readings[i - 1].at) / 1000;
    const joined = seconds * 1000 <= GAP_MS && typeof a === "number" && b >= a;
    points.push([readings[i].at, joined ? (b - a) / seconds : null]);
  }
  return points;
}

function ago(ms) {
  return ms < 120000 ? `${Math.round(ms / 1000)} s ago` : `${Math.round(ms / 60000)} min ago`;
}

// One chart: lines over the readings kept (at most HISTORY_MS) on a 0..top scale, with a
// y-axis of 0, half and top, and a legend of the latest values in which each series shows
// its colour and dash. The SVG stretches to its box; its text is HTML, so it stays legible.
function chart(title, lines, now, format) {
  const [width, height] = [600, 150];
  const values = lines.flatMap(([, points]) => points.map(([, v]) => v)).filter((v) => v !== null);
  const top = niceTop(Math.max(1, ...values));
  const span = Math.max(POLL_MS, now - readings[0].at);
  const x = (at) => ((at - (now - span)) / span) * width;
  const y = (value) => height - (value / top) * height;
  const drawing = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" });
  for (const fraction of [0.25, 0.5, 0.75]) {
    const level = height * fraction;
    drawing.append(svg("line", { class: "grid", x1: 0, x2: width, y1: level, y2: level }));
  }
  const legend = el("ul", { class: "legend" });
  for (const [name, points] of lines) {
    for (const run of runs(points)) {
      const at = run.map(([time, value]) => `${x(time).toFixed(1)},${y(value).toFixed(1)}`);
      drawing.append(svg("polyline", { class: name, points: at.join(" ") }));
    }
    const latestValue = points.length ? points[points.length - 1][1] : null;
    const swatch = svg("svg", { viewBox: "0 0 24 8", "aria-hidden": "true" });
    swatch.append(svg("line", { class: name, x1: 0, x2: 24, y1: 4, y2: 4 }));
    legend.append(el("li", { "data-series": name }, swatch, `${name} ${format(latestValue)}`));
  }
  const axis = el(
    "div",
    { class: "y-axis", "aria-label": `0 to ${compact(top)}` },
    el("span", {}, compact(top)),
    el("span", {}, compact(top / 2)),
    el("span", {}, "0"),
  );
  return el(
    "figure",
    { class: "chart" },
    el("h3", {}, title),
    el(
      "div",
      { class: "plot" },
      axis,
      drawing,
      el("div", { class: "x-axis" }, el("span", {}, ago(span)), el("span", {}, "now")),
    ),
    legend,
  );
}

// The stretches of points without a null between them (one is drawn as a short dash).
function runs(points) {
  const found = [];
  let current = [];
  for (const point of points) {
    if (point[1] === null) {
      if (current.length) found.push(current);
      current = [];
    } else {
      current.push(point);
    }
  }
  if (current.length) found.push(current);
  return found.map((run) =>
    run.length === 1 ? [run[0], [run[0][0] + POLL_MS / 3, run[0][1]]] : run,
  );
}

// The scale's top: 1, 2 or 5 times a power of ten, at or above the largest value.
function niceTop(largest) {
  const power = 10 ** Math.floor(Math.log10(largest));
  return [1, 2, 5, 10].map((step) => step * power).find((top) => top >= largest);
}

function stateCell(queue) {
  return el("td", { class: `state-${queue.state}` }, queue.state);
}

function emptyRow(columns, text) {
  return el("tr", {}, el("td", { class: "empty", colspan: columns }, text));
}

// A table's body: each row's cells take the classes that hide them on narrow screens
// from their column's heading, so a hidden column hides whole.
function fill(table, rows, emptyText) {
  const headings = [...table.tHead.rows[0].cells];
  for (const row of rows) {
    [...row.cells].forEach((td, i) => {
      for (const hiding of ["opt", "wide-only"]) {
        if (headings[i]?.classList.contains(hiding)) td.classList.add(hiding);
      }
    });
  }
  table.tBodies[0].replaceChildren(
    ...(rows.length ? rows : [emptyRow(headings.length, emptyText)]),
  );
}

function queueLink(name) {
  return el("a", { href: QUEUE_VIEW + encodeURIComponent(name) }, name);
}

function client(connection) {
  if (connection.transport === "tcp") return "remote, over tcp";
  if (connection.transport === "amqp") return "an AMQP client, through the AMQP port";
  const process = connection.process ? ` ${connection.process}` : "";
  return `pid ${connection.pid ?? "–"}${process}`;
}

function drawConnections(connections) {
  const rows = connections.map((c) =>
    el(
      "tr",
      { "data-connection": c.connection },
      cell(c.connection, "id"),
      cell(client(c)),
      numberCell(count(c.consumers)),
      numberCell(count(c.unacked)),
      cell(c.queues.map((q) => q.queue).join(", ")),
    ),
  );
  fill($("connection-table"), rows, "no connection consumes");
}

// Every consumer of every classic queue: its queue, its connection, its prefetch.
function drawConsumers(queues) {
  const rows = queues.flatMap((q) =>
    (q.consumer_details ?? []).map((c) =>
      el(
        "tr",
        { "data-consumer": `${q.name} ${c.connection}` },
        cell(q.name, "", queueLink(q.name)),
        cell(c.connection, "id"),
        numberCell(count(c.consumers)),
        numberCell(c.prefetch_count ? count(c.prefetch_count) : "–"),
        numberCell(count(c.unacked)),
      ),
    ),
  );
  fill($("consumers"), rows, "no consumers");
}

function exchangeName(name) {
  return name === "" ? "(default)" : name;
}

// The default exchange routes to every queue by its name: as many bindings as queues.
function drawExchanges(exchanges, bindings) {
  const rows = exchanges.map((e) =>
    el(
      "tr",
      { "data-exchange": e.name },
      cell(exchangeName(e.name)),
      cell(e.kind),
      cell(e.durable ? "durable" : "transient"),
      numberCell(
        count(
          e.name === ""
            ? latest.queues.length
            : bindings.filter((b) => b.exchange === e.name).length,
        ),
      ),
    ),
  );
  fill($("exchange-table"), rows, "no exchanges");
}

function bindingRow(b) {
  return el(
    "tr",
    { "data-binding": `${b.exchange} ${b.routing_key} ${b.queue}` },
    cell(exchangeName(b.exchange)),
    cell(b.routing_key === "" ? "(none)" : b.routing_key),
    cell(b.queue, "", queueLink(b.queue)),
  );
}

function drawBindings(bindings) {
  fill($("bindings"), bindings.map(bindingRow), "no bindings: publishers use the default exchange");
}

// The queues whose name holds the filter's text (any case), and how many of them.
function drawQueues(queues) {
  const wanted = $("queue-filter").value.trim().toLowerCase();
  const shown = queues.filter((q) => q.name.toLowerCase().includes(wanted));
  const total = counted(queues.length, "queue");
  $("queue-count").textContent = wanted ? `${shown.length} of ${total}` : "";
  const rows = shown.map((q) => {
    const per = (key) => rate(rateOf((r) => r.queues.get(q.name)?.[key]));
    return el(
      "tr",
      { "data-queue": q.name },
      cell(q.name, "name", queueLink(q.name)),
      stateCell(q),
      numberCell(count(q.messages_ready), "ready"),
      numberCell(count(q.messages_unacked), "unacked"),
      numberCell(count(q.consumers)),
      numberCell(per("messages_published_total")),
      numberCell(per("messages_delivered_total")),
      numberCell(per("messages_acknowledged_total")),
      numberCell(bytes(q.messages_ram_bytes)),
      numberCell(bytes(q.messages_disk_bytes)),
    );
  });
  fill($("queue-table"), rows, wanted ? "no queue's name holds that" : "no queues");
}

function streamConsumers(stream) {
  const groups = Object.entries(stream.consumer_groups ?? {}).map(
    ([name, g]) => `${name} (group of ${counted(g.members, "member")})`,
  );
  return Object.entries(stream.consumer_offsets ?? {})
    .map(([name, c]) => `${name} (${count(c.lag)})`)
    .concat(groups);
}

// "partition 2 of invoices" for a super stream's partition, else nothing
function partitionOf(stream) {
  if (stream.super_stream == null) return "";
  return `partition ${stream.partition} of ${stream.super_stream}`;
}

function drawStreams(streams) {
  const rows = streams.map((s) => {
    const consumers = streamConsumers(s);
    return el(
      "tr",
      { "data-stream": s.name },
      cell(
        s.name,
        "name",
        queueLink(s.name),
        partitionOf(s) ? el("span", { class: "muted" }, ` · ${partitionOf(s)}`) : null,
      ),
      stateCell(s),
      numberCell(count(s.first_offset)),
      numberCell(count(s.committed_offset), "committed"),
      numberCell(count(s.last_offset)),
      numberCell(count(s.segments)),
      numberCell(bytes(s.bytes)),
      numberCell(rate(rateOf((r) => r.queues.get(s.name)?.messages_published_total))),
      cell(consumers.length ? consumers.join(", ") : "–", "consumers"),
    );
  });
  fill($("stream-table"), rows, "no streams");
}

// The tree as nested lists: each supervisor with its strategy, each worker with its pid
// and memory, and everyone's state and restarts. A supervisor of many children (the
// queues') shows them folded until opened, and stays as the user left it.
function drawTree(root) {
  $("tree").replaceChildren(root === null ? el("li", {}, "starting…") : branch(root));
}

function branch(child) {
  const details = [child.kind === "supervisor" ? child.strategy : `pid ${child.pid ?? "–"}`];
  if (child.rss_bytes) details.push(bytes(child.rss_bytes));
  const restarts = child.restarts ?? 0;
  const line = [
    el("span", { class: "id" }, child.id),
    " ",
    el("span", { class: `state-${child.state}` }, child.state),
    " ",
    el("span", { class: restarts ? "restarted" : "detail" }, counted(restarts, "restart")),
    " ",
    el("span", { class: "detail" }, details.join(" · ")),
  ];
  const item = el("li", { "data-actor": child.id });
  const children = child.children ?? [];
  if (children.length < TREE_FOLDED_FROM) {
    item.append(...line);
    if (children.length) item.append(el("ul", {}, ...children.map(branch)));
    return item;
  }
  const fold = el(
    "details",
    {},
    el("summary", {}, ...line, el("span", { class: "detail" }, ` · ${children.length} children`)),
    el("ul", {}, ...children.map(branch)),
  );
  fold.open = unfolded.has(child.id);
  fold.addEventListener("toggle", () =>
    fold.open ? unfolded.add(child.id) : unfolded.delete(child.id),
  );
  item.append(fold);
  return item;
}

// ---------------------------------------------------------------- one queue's view

function viewedQueue() {
  if (!location.hash.startsWith(QUEUE_VIEW)) return null;
  try {
    return decodeURIComponent(location.hash.slice(QUEUE_VIEW.length));
  } catch {
    return location.hash.slice(QUEUE_VIEW.length);
  }
}

// The queue the fragment names, or the node's view when it names none.
function drawView(now) {
  const name = viewedQueue();
  $("figures").hidden = name !== null;
  $("queue-view").hidden = name === null;
  if (name === null || latest === null) return;
  document.title = `${name} · Warren ${latest.overview.node}`;
  const queue = latest.queues.find((q) => q.name === name);
  const back = el("p", { class: "back" }, el("a", { href: "#queues" }, "← every queue"));
  if (queue === undefined) {
    $("queue-view").replaceChildren(
      back,
      el("section", { class: "card wide" }, el("h2", {}, `No queue ${name} on this node.`)),
    );
    return;
  }
  const sections =
    queue.type === "stream" ? streamSections(queue, now) : classicSections(queue, now);
  $("queue-view").replaceChildren(back, ...sections);
}

function figureList(figures) {
  return el(
    "dl",
    { class: "figures" },
    ...figures.map(([name, value]) => el("div", {}, el("dt", {}, name), el("dd", {}, value))),
  );
}

function queueHeading(queue) {
  return el(
    "h2",
    {},
    `${queue.type === "stream" ? "Stream" : "Queue"} ${queue.name} `,
    el("span", { class: `state-${queue.state}` }, queue.state),
  );
}

// The queue's bindings besides the default exchange's, which every queue has.
function queueBindings(name) {
  const bound = latest.bindings.filter((b) => b.queue === name);
  if (!bound.length) {
    return el("p", { class: "muted" }, "Only the default exchange's, with the queue's name.");
  }
  const table = el(
    "table",
    { class: "fixed" },
    el("thead", {}, el("tr", {}, el("th", {}, "exchange"), el("th", {}, "routing key"))),
    el("tbody", {}),
  );
  fill(
    table,
    bound.map((b) => {
      const row = bindingRow(b);
      row.lastChild.remove();
      return row;
    }),
    "",
  );
  return table;
}

function queueCharts(name, now, rates, depths) {
  const pick = (key) => (r) => r.queues.get(name)?.[key];
  const lines = rates.map(([line, key]) => [line, series(pick(key))]);
  const charts = [chart("Messages per second", lines, now, rate)];
  if (depths.length) {
    const levels = depths.map(([line, key]) => [
      line,
      readings.map((r) => [r.at, pick(key)(r) ?? null]),
    ]);
    charts.push(chart("Messages in the queue", levels, now, count));
  }
  return el("div", { class: "charts" }, ...charts);
}

function classicSections(q, now) {
  const deadLettered = Object.entries(q.messages_dead_lettered_total ?? {})
    .filter(([, n]) => n)
    .map(([reason, n]) => `${reason} ${count(n)}`)
    .join(", ");
  const figures = figureList([
    ["ready", count(q.messages_ready)],
    ["unacked", count(q.messages_unacked)],
    ["in all", count(q.messages)],
    ["persistent", count(q.messages_persistent)],
    ["in RAM", bytes(q.messages_ram_bytes)],
    ["on disk", bytes(q.messages_disk_bytes)],
    ["consumers", count(q.consumers)],
    ["published", count(q.messages_published_total)],
    ["delivered", count(q.messages_delivered_total)],
    ["acknowledged", count(q.messages_acknowledged_total)],
    ["dead-lettered", deadLettered || "–"],
  ]);
  const states = el(
    "dl",
    { class: "states" },
    ...VARIABLE_QUEUE_STATES.map(([letter, key, meaning]) =>
      el(
        "div",
        { "data-state": key },
        el("dt", { title: key }, letter),
        el("dd", {}, count(q[key])),
        el("small", {}, meaning),
      ),
    ),
  );
  const consumerRows = (q.consumer_details ?? []).map((c) =>
    el(
      "tr",
      { "data-consumer": c.connection },
      cell(c.connection, "id"),
      cell(client(latest.connections.find((n) => n.connection === c.connection) ?? c)),
      numberCell(count(c.consumers)),
      numberCell(c.prefetch_count ? count(c.prefetch_count) : "–"),
      numberCell(count(c.unacked)),
    ),
  );
  const consumers = el(
    "table",
    { class: "fixed" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { class: "id" }, "connection"),
        el("th", { class: "opt" }, "client"),
        el("th", { class: "n opt" }, "consumers"),
        el("th", { class: "n" }, "prefetch"),
        el("th", { class: "n" }, "unacked"),
      ),
    ),
    el("tbody", {}),
  );
  fill(consumers, consumerRows, "no consumers");
  return [
    el("section", { class: "card wide" }, queueHeading(q), figures),
    el(
      "section",
      { class: "card" },
      el("h2", {}, "Messages by variable-queue state"),
      states,
    ),
    el("section", { class: "card" }, el("h2", {}, "Bindings"), queueBindings(q.name)),
    el(
      "section",
      { class: "card wide" },
      el("h2", {}, "Rates"),
      queueCharts(q.name, now, QUEUE_RATES, NODE_DEPTHS),
    ),
    el("section", { class: "card wide" }, el("h2", {}, "Consumers"), consumers),
  ];
}

function streamSections(s, now) {
  const figures = figureList([
    ["first offset", count(s.first_offset)],
    ["committed offset", count(s.committed_offset)],
    ["last offset", count(s.last_offset)],
    ["segments", count(s.segments)],
    ["bytes", bytes(s.bytes)],
    ["producers", count(s.producers)],
    ["published", count(s.messages_published_total)],
    ["super stream", partitionOf(s) || "–"],
    ["consumer groups", streamConsumers({ consumer_groups: s.consumer_groups }).join(", ") || "–"],
  ]);
  const consumers = Object.entries(s.consumer_offsets ?? {}).map(([name, c]) =>
    el(
      "tr",
      { "data-consumer": name },
      cell(name),
      numberCell(count(c.offset)),
      numberCell(count(c.lag)),
    ),
  );
  const table = el(
    "table",
    { class: "fixed" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", {}, "named consumer"),
        el("th", { class: "n" }, "offset"),
        el("th", { class: "n" }, "lag"),
      ),
    ),
    el("tbody", {}),
  );
  fill(table, consumers, "no named consumer has stored an offset");
  return [
    el("section", { class: "card wide" }, queueHeading(s), figures),
    el("section", { class: "card" }, el("h2", {}, "Named consumers"), table),
    el("section", { class: "card" }, el("h2", {}, "Bindings"), queueBindings(s.name)),
    el(
      "section",
      { class: "card wide" },
      el("h2", {}, "Rates"),
      queueCharts(s.name, now, [["published", "messages_published_total"]], []),
    ),
  ];
}

$("queue-filter").addEventListener("input", () => {
  if (latest !== null) drawQueues(latest.queues.filter((q) => q.type !== "stream"));
});

window.addEventListener("hashchange", () => {
  if (latest !== null) drawView(readings[readings.length - 1].at);
  if (viewedQueue() !== null) window.scrollTo(0, 0);
});

poll();
