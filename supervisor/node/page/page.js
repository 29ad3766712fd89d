// Warren's management page. Every POLL_MS it asks the node for api/overview, api/queues
// and api/tree, all three at once; when they answer it redraws the page, and keeps the
// readings of the last HISTORY_MS, from which it computes the rates (the API gives
// counters: a rate is the growth of a counter between two readings over the time between
// them) and draws the charts as inline SVG. When a poll fails or times out, a banner says
// since when the node has not answered, the figures are greyed as stale, and polling goes
// on; the first answer after that clears it. Read-only: it only ever sends GETs.
// Everything the node names (queues, streams, actors) is written as text, never as HTML.
"use strict";

const POLL_MS = 3000; // how often the node is asked
const TIMEOUT_MS = 2500; // a poll unanswered this long counts as the node not answering
const HISTORY_MS = 5 * 60 * 1000; // what the charts show, and the readings kept
const GAP_MS = 3 * POLL_MS; // readings further apart than this are not joined by a line
const SVG = "http://www.w3.org/2000/svg"; // the namespace of SVG elements, not a fetch

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

const readings = []; // {at, overview, queues: Map name -> document}, oldest first
let notAnsweringSince = null; // the time of the first failed poll since the last answer

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

function clock(time) {
  const two = (n) => String(n).padStart(2, "0");
  return `${two(time.getHours())}:${two(time.getMinutes())}:${two(time.getSeconds())}`;
}

function count(value) {
  if (value === null || value === undefined) return "–";
  return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(1);
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
    answers = await Promise.all(["api/overview", "api/queues", "api/tree"].map(getJson));
  } catch (error) {
    notAnswering(error);
  }
  setTimeout(poll, POLL_MS);
  if (answers !== null) answered(...answers);
}

function answered(overview, queues, tree) {
  const at = Date.now();
  readings.push({ at, overview, queues: new Map(queues.map((q) => [q.name, q])) });
  while (readings[0].at < at - HISTORY_MS) readings.shift();
  if (notAnsweringSince !== null) {
    $("last-outage").textContent =
      `The node did not answer from ${clock(notAnsweringSince)} to ${clock(new Date(at))}.`;
    notAnsweringSince = null;
  }
  $("outage").hidden = true;
  $("figures").classList.remove("stale");
  drawSummary(overview, tree);
  drawAlarms(overview);
  drawTotals(overview);
  drawStores(overview.stores);
  drawCharts(at);
  drawQueues(queues.filter((q) => q.type !== "stream"));
  drawStreams(queues.filter((q) => q.type === "stream"));
  drawTree(tree.tree);
  $("updated").textContent = `Last answer at ${clock(new Date(at))}.`;
}

function notAnswering(error) {
  if (notAnsweringSince === null) notAnsweringSince = new Date();
  const reason =
    error.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : error.message;
  $("outage").textContent =
    `Node not answering since ${clock(notAnsweringSince)} (${reason}); still trying. ` +
    "The figures below are the last it gave.";
  $("outage").hidden = false;
  $("figures").classList.add("stale");
}

function drawSummary(overview, tree) {
  $("node-name").textContent = overview.node;
  document.title = `Warren ${overview.node}`;
  const unanswered = overview.actors_unanswered.length;
  $("node-summary").replaceChildren(
    el("span", { class: `state-${overview.state}` }, overview.state),
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
  $("resources").replaceChildren(...rows);
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
  $("totals").replaceChildren(
    ...figures.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]),
  );
}

function drawStores(stores) {
  const rows = Object.entries(stores).map(([name, store]) =>
    el(
      "tr",
      { "data-store": name },
      el("td", {}, name.replace("msg_store_", "")),
      el("td", { class: "n" }, count(store.messages)),
      el("td", { class: "n" }, count(store.files)),
      el("td", { class: "n" }, bytes(store.bytes)),
      el("td", { class: "n" }, `${Math.round((store.garbage_ratio ?? 0) * 100)} %`),
    ),
  );
  $("stores").tBodies[0].replaceChildren(...(rows.length ? rows : [emptyRow(5, "not answering")]));
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
// legend of the latest values. The SVG stretches to its box; its text is HTML, so it
// stays legible.
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
    const latest = points.length ? points[points.length - 1][1] : null;
    legend.append(el("li", { class: name }, `${name} ${format(latest)}`));
  }
  return el(
    "figure",
    { class: "chart" },
    el("h3", {}, title),
    drawing,
    el(
      "div",
      { class: "axis" },
      el("span", {}, ago(span)),
      el("span", {}, `top ${format(top)}`),
      el("span", {}, "now"),
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

function drawQueues(queues) {
  const rows = queues.map((q) => {
    const per = (key) => rate(rateOf((r) => r.queues.get(q.name)?.[key]));
    return el(
      "tr",
      { "data-queue": q.name },
      el("td", { class: "name" }, q.name),
      stateCell(q),
      el("td", { class: "n ready" }, count(q.messages_ready)),
      el("td", { class: "n unacked" }, count(q.messages_unacked)),
      el("td", { class: "n" }, count(q.consumers)),
      el("td", { class: "n" }, per("messages_published_total")),
      el("td", { class: "n" }, per("messages_delivered_total")),
      el("td", { class: "n" }, per("messages_acknowledged_total")),
      el("td", { class: "n" }, bytes(q.messages_ram_bytes)),
      el("td", { class: "n" }, bytes(q.messages_disk_bytes)),
    );
  });
  $("queues").tBodies[0].replaceChildren(...(rows.length ? rows : [emptyRow(10, "no queues")]));
}

function drawStreams(streams) {
  const rows = streams.map((s) => {
    const consumers = Object.entries(s.consumer_offsets ?? {}).map(
      ([name, c]) => `${name} (${count(c.lag)})`,
    );
    return el(
      "tr",
      { "data-stream": s.name },
      el("td", { class: "name" }, s.name),
      stateCell(s),
      el("td", { class: "n" }, count(s.first_offset)),
      el("td", { class: "n committed" }, count(s.committed_offset)),
      el("td", { class: "n" }, count(s.last_offset)),
      el("td", { class: "n" }, count(s.segments)),
      el("td", { class: "n" }, bytes(s.bytes)),
      el("td", { class: "n" }, rate(rateOf((r) => r.queues.get(s.name)?.messages_published_total))),
      el("td", { class: "consumers" }, consumers.length ? consumers.join(", ") : "–"),
    );
  });
  $("streams").tBodies[0].replaceChildren(...(rows.length ? rows : [emptyRow(9, "no streams")]));
}

// The tree as nested lists: each supervisor with its strategy, each worker with its pid
// and memory, and everyone's state and restarts.
function drawTree(root) {
  $("tree").replaceChildren(root === null ? el("li", {}, "starting…") : branch(root));
}

function branch(child) {
  const details = [child.kind === "supervisor" ? child.strategy : `pid ${child.pid ?? "–"}`];
  if (child.rss_bytes) details.push(bytes(child.rss_bytes));
  const restarts = child.restarts ?? 0;
  const item = el(
    "li",
    { "data-actor": child.id },
    el("span", { class: "id" }, child.id),
    " ",
    el("span", { class: `state-${child.state}` }, child.state),
    " ",
    el("span", { class: restarts ? "restarted" : "detail" }, counted(restarts, "restart")),
    " ",
    el("span", { class: "detail" }, details.join(" · ")),
  );
  if (child.children && child.children.length) {
    item.append(el("ul", {}, ...child.children.map(branch)));
  }
  return item;
}

poll();
