// steptail's page (docs/page.md): the runs table at `/`, a run at `/?run=NAME` (`&vs=CONTROL`
// overlays another run, `&part=KEY` picks the loss part, `&poll=SECONDS` the polling period,
// `&summary=STEPS` and `&buckets=N` when a run is drawn from /series and how finely).
// Plain JavaScript, no build step. Everything from the store reaches the DOM as text
// (textContent, never innerHTML); strings handed to plotly, which reads a few HTML-like tags in
// labels, are escaped first (plain()).
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(250, 1000 * (Number(params.get("poll")) || 5));
  const PAGE = 10000; // rows per /steps request (the API's largest page)
  const RELOAD_MS = 30000; // a run's steps are read whole again at most this often
  const GOODPUT_MS = 30000; // a run's goodput (computed from all its steps) is asked at most this often
  // where the time went (docs/goodput.md), in the bar's order
  const TIME_PARTS = [
    ["productive_s", "productive"], ["replayed_s", "replayed"], ["recovery_s", "recovery"],
    ["checkpoint_s", "checkpoint"], ["other_s", "other"],
  ];
  const COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22"];
  const SEVERITY = { critical: "#b3261e", warning: "#e08a00" };
  const GAP_FILL = { gap: "rgba(214,39,40,0.16)", head_gap: "rgba(255,127,14,0.18)" };
  const SPARK = 60; // buckets of a run's sparkline on the runs table
  const MAX_LINES = 300; // vertical marker lines drawn at most (NaN steps); markers are always drawn
  // A run longer than this is drawn from /series (per bucket of steps: min, max, last, NaN; a
  // bounded answer whatever its length), zoomed ranges are asked again, and only its last TAIL
  // steps are read whole (facts, loss parts). `&summary=N` sets the threshold (0: always).
  const SUMMARY_STEPS = params.has("summary") ? Number(params.get("summary")) : 5000;
  const TAIL = 1000;
  const RBF_BUCKETS = 200; // columns of the per-layer REQUIRED_RBF panel
  // not rbf_per_layer: most of a step's bytes (the per-layer panel asks /rbf-layers, on demand)
  const FIELDS = "ts,ce,ce_raw,parts,rbf_max,rbf_program";

  // What the page shows, for people debugging it and for the tests (tests/test_page.py).
  const state = (window.steptailState = { view: null, ready: false, polls: 0, renders: 0, error: null });
  const $ = (id) => document.getElementById(id);

  // -- DOM: every value goes in as text ----------------------------------------------------
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "data") for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
    return node;
  }
  // A refresh rebuilds the rows; a <details> the reader opened stays open (same text, same table).
  function fill(tbody, rows) {
    const opened = new Set([...tbody.querySelectorAll("details[open] .full")].map((d) => d.textContent));
    if (opened.size)
      for (const row of rows)
        for (const d of row.querySelectorAll("details")) if (opened.has(d.querySelector(".full")?.textContent)) d.open = true;
    tbody.replaceChildren(...rows);
  }
  function setText(id, text) {
    $(id).textContent = text == null ? "" : String(text);
  }
  // plotly turns <br>, <b>, <a href> … in labels and hover text into markup: escape what is not ours.
  function plain(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  // A finding's or event's text for a table cell: short (the stream's UUID out, the first clause,
  // at most SHORT characters), the whole one click away (<details>), all as text.
  const SHORT = 90;
  const UUID = /\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b/gi;
  function shortened(text) {
    const full = String(text ?? "");
    let short = full.replace(UUID, "…").replace(/\s+/g, " ").trim();
    const stop = short.search(/[;:(]\s|\.\s/);
    if (stop > 20) short = short.slice(0, stop);
    if (short.length > SHORT) short = short.slice(0, SHORT - 1).replace(/\s+\S*$/, "") + "…";
    if (short === full) return el("span", { class: "short" }, full);
    return el("details", { class: "short" }, el("summary", {}, short), el("div", { class: "full" }, full));
  }
  function stepRange(a, b) {
    return a === b ? `step ${a}` : `steps ${a}–${b}`;
  }
  function runLink(run) {
    return "?" + new URLSearchParams({ run }).toString();
  }
  function parseTime(iso) {
    return iso ? Date.parse(iso.replace(/(\.\d{3})\d+/, "$1")) : NaN;
  }
  function age(iso) {
    const t = parseTime(iso);
    if (Number.isNaN(t)) return "";
    const s = Math.max(0, (Date.now() - t) / 1000);
    if (s < 90) return `${Math.round(s)} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${Math.round(s / 3600)} h`;
    return `${Math.round(s / 86400)} d`;
  }
  function ranges(steps) {
    // sorted integers -> [[first, last], …]
    const out = [];
    for (const s of steps) {
      const r = out[out.length - 1];
      if (r && s === r[1] + 1) r[1] = s;
      else if (!r || s > r[1]) out.push([s, s]);
    }
    return out;
  }

  // -- the API: bearer token, ETags -------------------------------------------------------
  let token = sessionStorage.getItem("steptail-token");
  class AuthNeeded extends Error {}

  async function api(path, etag) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    if (etag) headers["If-None-Match"] = etag;
    // no-store: the browser's cache neither answers nor rewrites our conditional requests
    const resp = await fetch(path, { headers, cache: "no-store" });
    if (resp.status === 304) return { status: 304, etag, data: null };
    if (resp.status === 401) {
      askToken();
      throw new AuthNeeded("this server needs its bearer token");
    }
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    if (!resp.ok) {
      const err = new Error((data && data.error) || `HTTP ${resp.status} for ${path}`);
      err.status = resp.status;
      throw err;
    }
    return { status: resp.status, etag: resp.headers.get("ETag"), data };
  }

  // One JSON answer kept with its ETag: fetch() is true when it changed.
  class Tagged {
    constructor(path) {
      this.path = path;
      this.etag = null;
      this.data = null;
    }
    async fetch() {
      const r = await api(this.path, this.etag);
      if (r.status === 304) return false;
      this.etag = r.etag;
      this.data = r.data;
      return true;
    }
  }

  function askToken() {
    const form = $("token-form");
    if (!form.hidden) return;
    form.hidden = false;
    $("token-input").focus();
  }
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token-input").value.trim();
    sessionStorage.setItem("steptail-token", token);
    $("token-form").hidden = true;
    start();
  });

  // -- a run's steps, read with the API's keyset pages ----------------------------------------
  function cmpKey(a, b) {
    return a[0] - b[0] || a[1] - b[1];
  }
  class Series {
    constructor(run) {
      this.run = run;
      this.base = `api/runs/${encodeURIComponent(run)}/steps`;
      this.from = null; // "INC:STEP": read only the steps after it (a long run's tail)
      this.reset();
    }
    reset() {
      this.incs = new Map(); // incarnation -> {steps, ce, raw, parts, rbf, rbfOnly}
      this.rows = 0; // LOSS-PARTS rows
      this.last = null; // [incarnation, step] of the last row read
      this.lastRow = null;
      this.lastKind = null;
      this.partKeys = [];
      this.stale = false; // rows appeared behind the last one read: read all again
      this.pollPath = null;
      this.pollTag = null;
      this.loadedAt = 0;
    }
    inc(n) {
      let i = this.incs.get(n);
      if (!i) {
        i = { n, steps: [], ce: [], raw: [], parts: [], rbf: [], rbfOnly: [], ts: [] };
        this.incs.set(n, i);
      }
      return i;
    }
    // Rows in key order; the last row read is read again by each poll (its REQUIRED_RBF line
    // may come in a later commit) and replaces the kept one. True when anything changed.
    add(rows) {
      let changed = false;
      for (const r of rows) {
        const key = [r.incarnation, r.step];
        const order = this.last ? cmpKey(key, this.last) : 1;
        if (order < 0) {
          this.stale = true;
          continue;
        }
        if (order === 0) {
          if (JSON.stringify(r) === JSON.stringify(this.lastRow)) continue;
          this.dropLast();
        }
        const inc = this.inc(r.incarnation);
        const hasRbf = r.rbf_max != null || r.rbf_program != null || r.rbf_per_layer != null;
        if (r.ce_raw !== null && r.ce_raw !== undefined) {
          inc.steps.push(r.step);
          inc.ce.push(typeof r.ce === "number" ? r.ce : null);
          inc.raw.push(r.ce_raw);
          inc.parts.push(r.parts || {});
          inc.rbf.push(hasRbf);
          inc.ts.push(r.ts ? parseTime(r.ts) : null);
          for (const k of Object.keys(r.parts || {}))
            if (!this.partKeys.includes(k)) {
              this.partKeys.push(k);
              this.partKeys.sort(); // by name: PostgreSQL (JSONB) does not keep the log's order
            }
          this.rows += 1;
          this.lastKind = "loss";
        } else {
          inc.rbfOnly.push(r.step);
          this.lastKind = "rbf";
        }
        this.last = key;
        this.lastRow = r;
        changed = true;
      }
      return changed;
    }
    dropLast() {
      const inc = this.incs.get(this.last[0]);
      if (this.lastKind === "loss") {
        for (const a of [inc.steps, inc.ce, inc.raw, inc.parts, inc.rbf, inc.ts]) a.pop();
        this.rows -= 1;
      } else {
        inc.rbfOnly.pop();
      }
    }
    async pages(path, first) {
      let changed = false;
      let r = first;
      for (;;) {
        changed = this.add(r.data.steps) || changed;
        const next = r.data.next;
        if (!next) return { changed, etag: r.etag };
        r = await api(this.base + next.slice(next.indexOf("?")));
      }
    }
    async load() {
      this.reset();
      this.loadedAt = Date.now();
      await this.poll();
      return true;
    }
    // The steps after the last one read (and that one again): a 304 while nothing changed.
    async poll() {
      let path = `${this.base}?limit=${PAGE}&fields=${FIELDS}`;
      const after = this.last ? `${this.last[0]}:${Math.max(-1, this.last[1] - 1)}` : this.from;
      if (after) path = `${this.base}?after=${encodeURIComponent(after)}&limit=${PAGE}&fields=${FIELDS}`;
      const r = await api(path, path === this.pollPath ? this.pollTag : null);
      if (r.status === 304) return false;
      const { changed } = await this.pages(path, r);
      this.pollPath = path;
      this.pollTag = r.data.next ? null : r.etag;
      return changed;
    }
    // Read it all again when rows came in behind the last one read (a late row of an earlier
    // incarnation, a gap filled by another ingest): the outline's counts say so.
    needsReload(outline) {
      if (this.stale) return true;
      if (!outline || this.from) return false; // a tail holds fewer rows than the outline counts
      return outline.incarnations.some((i) => (this.incs.get(i.incarnation)?.steps.length ?? 0) < i.steps);
    }
    // CE by step, the latest incarnation's where several recorded a step (as `steptail compare`).
    latestCe() {
      const byStep = new Map();
      for (const n of [...this.incs.keys()].sort((a, b) => a - b)) {
        const i = this.incs.get(n);
        i.steps.forEach((s, k) => byStep.set(s, i.ce[k]));
      }
      return byStep;
    }
  }

  // x, y with a null where steps are missing, so that the line breaks there
  function broken(steps, values) {
    const x = [];
    const y = [];
    let prev = null;
    for (let k = 0; k < steps.length; k++) {
      const s = steps[k];
      if (prev !== null && s > prev + 1) {
        x.push((prev + s) / 2);
        y.push(null);
      }
      x.push(s);
      y.push(values[k]);
      prev = s;
    }
    return { x, y };
  }

  let plotlyLoading = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve();
    // once: the first draw of a long run and the view's start both wait for it
    return (plotlyLoading = plotlyLoading || new Promise((resolve, reject) => {
      const s = el("script", { src: "static/plotly.min.js" });
      s.onload = resolve;
      s.onerror = () => reject(new Error("could not load static/plotly.min.js"));
      document.head.append(s);
    }));
  }
  const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  // -- the runs table -------------------------------------------------------------------------
  class RunsView {
    constructor() {
      this.overview = new Tagged("api/overview");
      this.sparks = new Map(); // run -> Tagged /series?buckets=SPARK
    }
    async start() {
      $("runs-view").hidden = false;
      setText("crumb", "runs");
      document.title = "steptail: runs";
      state.view = "runs";
      await this.update();
    }
    async update() {
      let changed = await this.overview.fetch();
      // each run's CE sparkline: a bounded /series, a 304 while the run is unchanged
      const runs = this.overview.data.runs.map((r) => r.run);
      for (const run of runs)
        if (!this.sparks.has(run)) this.sparks.set(run, new Tagged(`api/runs/${encodeURIComponent(run)}/series?buckets=${SPARK}`));
      const got = await Promise.all(runs.map((run) => this.sparks.get(run).fetch().catch((e) => {
        if (e instanceof AuthNeeded) throw e;
        return false; // removed meanwhile, or an older server: no sparkline
      })));
      if (got.some(Boolean)) changed = true;
      if (changed) this.render();
      else this.ages(); // ages move on even when nothing else does
    }
    // CE of the run's buckets as an SVG polyline (latest incarnation on top; no plotly here)
    spark(run) {
      const sd = this.sparks.get(run) && this.sparks.get(run).data;
      const pts = [];
      for (const inc of (sd && sd.incarnations) || [])
        for (const r of inc.rows) {
          const b = Object.fromEntries(sd.columns.map((c, j) => [c, r[j]]));
          if (typeof b.ce_last === "number") pts.push([b.s1, b.ce_last, inc.incarnation]);
        }
      const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      svg.setAttribute("class", "spark");
      svg.setAttribute("width", "120");
      svg.setAttribute("height", "24");
      svg.dataset.points = String(pts.length);
      if (pts.length < 2) return svg;
      const xs = pts.map((p) => p[0]);
      const ys = pts.map((p) => p[1]);
      const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
      const incs = [...new Set(pts.map((p) => p[2]))];
      incs.forEach((n, k) => {
        const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
        line.setAttribute("fill", "none");
        line.setAttribute("stroke", COLORS[k % COLORS.length]);
        line.setAttribute("stroke-width", "1.2");
        line.setAttribute("points", pts.filter((p) => p[2] === n).map(([x, y]) =>
          `${(2 + (116 * (x - x0)) / (x1 - x0 || 1)).toFixed(1)},${(22 - (20 * (y - y0)) / (y1 - y0 || 1)).toFixed(1)}`).join(" "));
        svg.append(line);
      });
      return svg;
    }
    render() {
      // followed runs first (live, then stalled, then not followed since), each group by name
      const rank = { live: 0, stalled: 1, unknown: 2 };
      const runs = [...this.overview.data.runs].sort((a, b) => (rank[a.state] ?? 3) - (rank[b.state] ?? 3));
      state.runs = runs.map((r) => r.run);
      state.ready = true;
      state.renders += 1;
      $("runs-empty").hidden = runs.length > 0;
      fill(
        $("runs-table").tBodies[0],
        runs.map((r) => {
          const worst = r.critical ? "critical" : r.warning ? "warning" : r.findings ? "other" : "none";
          const badges = [];
          for (const sev of ["critical", "warning", "other"])
            if (r[sev]) badges.push(el("span", { class: `badge ${sev}` }, `${r[sev]} ${sev}`));
          // the last step's kubelet time; a log without timestamps: the last write to the run
          const when = r.last_ts || r.updated;
          const ageText = r.last_ts ? age(when) : when ? `${age(when)} (written)` : "";
          return el(
            "tr",
            { data: { run: r.run, state: r.state, findings: r.findings, severity: worst } },
            el("td", {}, el("a", { href: runLink(r.run) }, r.run)),
            el("td", {}, el("span", { class: `state ${r.state}`, title: r.state_reason || "" }, r.state)),
            el("td", { class: "spark-cell" }, this.spark(r.run)),
            el("td", { class: "note" }, r.sources.join(", ")),
            el("td", { class: "num" }, r.incarnations),
            el("td", { class: "num" }, r.steps),
            el("td", { class: "num" }, r.last_step === null ? "" : `${r.last_step} (#${r.last_incarnation})`),
            el("td", { class: "num" }, r.last_ce_raw ?? ""),
            el("td", { class: "num age", title: when || "", data: { time: r.last_ts || "", written: r.last_ts ? "" : when || "" } }, ageText),
            el("td", {}, badges.length ? badges : "none")
          );
        })
      );
    }
    ages() {
      for (const td of document.querySelectorAll("#runs-table td.age"))
        td.textContent = td.dataset.time ? age(td.dataset.time) : td.dataset.written ? `${age(td.dataset.written)} (written)` : "";
    }
  }

  // -- one run --------------------------------------------------------------------------------
  class RunView {
    constructor(run, vs) {
      this.run = run;
      const base = `api/runs/${encodeURIComponent(run)}`;
      this.series = new Series(run);
      this.outline = new Tagged(`${base}/outline`);
      this.findings = new Tagged(`${base}/findings`);
      this.events = new Tagged(`api/collector-events?run=${encodeURIComponent(run)}`);
      this.goodput = new Tagged(`${base}/goodput`);
      this.goodputAt = 0;
      this.pace = new Tagged(`${base}/step-times?buckets=1000`);
      this.config = new Tagged(`${base}/config`); // each incarnation's Config params
      this.configPick = null; // [incarnation, against], once picked
      for (const id of ["config-a", "config-b"])
        $(id).addEventListener("change", () => {
          this.configPick = [Number($("config-a").value), Number($("config-b").value)];
          this.renderConfig();
        });
      this.paceKey = ["seconds", "tokens_per_s", "tflops"].includes(params.get("pace")) ? params.get("pace") : "seconds";
      $("pace-select").value = this.paceKey;
      $("pace-select").addEventListener("change", (ev) => {
        this.paceKey = ev.target.value;
        this.remember();
        this.renderPace();
      });
      this.base = base;
      this.summary = undefined; // drawn from /series: decided on the first outline
      this.zoom = null; // [from, to] of the zoomed x range (summary only)
      this.visible = null; // [from, to]: the steps on screen (null: all)
      this.rbfLayers = null; // the per-layer REQUIRED_RBF panel's answer, asked when it is opened
      this.timeOrigin = null; // ms of the first step drawn unzoomed (x=elapsed keeps it when zoomed)
      $("rbf-panel").addEventListener("toggle", () => {
        if ($("rbf-panel").open) this.loadRbfLayers().catch(report);
      });
      this.ceSeries = null;
      this.overview = new Tagged("api/overview");
      this.part = params.get("part");
      this.partPicked = params.has("part"); // in the address only once picked
      this.setOverlay(vs);
      this.revision = 0;
      this.dirty = false; // something changed since the last render
      // reading aids, kept in the address: x axis (step, time, elapsed), smoothing (0–0.99), log y
      this.xMode = ["time", "elapsed"].includes(params.get("x")) ? params.get("x") : "step";
      this.smooth = Math.min(0.99, Math.max(0, Number(params.get("smooth")) || 0));
      this.logY = params.get("log") === "1";
      $("x-select").value = this.xMode;
      $("smooth-input").value = String(this.smooth);
      $("log-input").checked = this.logY;
      const aid = () => {
        this.xMode = $("x-select").value;
        this.smooth = Math.min(0.99, Math.max(0, Number($("smooth-input").value) || 0));
        this.logY = $("log-input").checked;
        this.remember();
        this.render();
      };
      for (const id of ["x-select", "smooth-input", "log-input"]) $(id).addEventListener("change", aid);
      $("overlay-select").addEventListener("change", (ev) => this.pickOverlay(ev.target.value));
      $("part-select").addEventListener("change", (ev) => {
        this.part = ev.target.value;
        this.partPicked = true;
        this.remember();
        this.render();
      });
    }
    setOverlay(vs) {
      this.vs = vs && vs !== this.run ? vs : null;
      this.control = this.vs ? new Series(this.vs) : null;
      this.controlError = null;
      this.controlOutline = this.vs ? new Tagged(`api/runs/${encodeURIComponent(this.vs)}/outline`) : null;
    }
    async start() {
      $("run-view").hidden = false;
      state.view = "run";
      state.run = this.run;
      setText("run-name", this.run);
      setText("crumb", this.run);
      document.title = `steptail: ${this.run}`;
      await Promise.all([loadPlotly(), this.update()]);
      this.draw();
    }
    drawBucketsFirst() {
      const sd = this.ceFirst.data;
      if (this.drawnOnce || !window.Plotly || !sd) return;
      const total = sd.incarnations.reduce((n, i) => n + i.rows.reduce((m, r) => m + r[1], 0), 0);
      if (total <= SUMMARY_STEPS) return;
      this.drawnOnce = true;
      const before = this.summary;
      this.summary = true; // drawn as one; decide() still makes the choice from the outline
      try {
        this.renderCe(this.deriveSummary(this.outline.data || { incarnations: [], gaps: [], restores: [], stream_gaps: [] }), []);
      } finally {
        this.summary = before;
      }
    }
    // The CE chart as soon as its data is in (findings, goodput and the runs list follow, and
    // the full render draws it again with them): the first draw waits for nothing else.
    drawCeFirst() {
      if (this.drawnOnce || !window.Plotly || !this.outline.data) return;
      this.drawnOnce = true;
      this.renderCe(this.derive(), []);
    }
    draw() {
      if (!this.dirty || !window.Plotly) return;
      this.drawnOnce = true;
      this.render();
      this.dirty = false;
    }
    remember() {
      const q = new URLSearchParams({ run: this.run });
      if (this.vs) q.set("vs", this.vs);
      if (this.part && this.partPicked) q.set("part", this.part);
      if (this.xMode !== "step") q.set("x", this.xMode);
      if (this.paceKey !== "seconds") q.set("pace", this.paceKey);
      if (this.smooth) q.set("smooth", String(this.smooth));
      if (this.logY) q.set("log", "1");
      for (const k of ["poll"]) if (params.has(k)) q.set(k, params.get(k));
      history.replaceState(null, "", "?" + q.toString());
    }
    async pickOverlay(vs) {
      this.setOverlay(vs);
      this.remember();
      try {
        if (this.control) await Promise.all([this.control.load(), this.controlOutline.fetch()]);
      } catch (e) {
        this.controlError = String(e.message || e);
      }
      this.dirty = true;
      this.draw();
    }
    // One poll: the outline first (its counts tell whether rows came in behind the last one
    // read), then only the steps after the last one read, then findings and the runs list.
    async update() {
      const t0 = performance.now();
      // the first time, /series is asked beside the outline (the two longest reads of a long run
      // at once); a short run's few buckets go unused
      let early = null;
      if (this.summary === undefined && !this.ceSeries) {
        const wide = Number(params.get("buckets")) || Math.max(200, Math.round($("ce-chart").clientWidth || 1200));
        this.buckets = Math.min(4000, Math.max(1, wide)); // about a bucket per pixel, fixed for the view
        this.ceSeries = new Tagged(this.seriesPath());
        // a long run's CE drawn from its buckets alone, not waiting for the outline (its missing
        // steps are a pass over the run), nor for the REQUIRED_RBF counts (`rbf=0`: counting them
        // reads every REQUIRED_RBF row); the gaps, restore lines and RBF strip follow
        this.ceFirst = new Tagged(`${this.seriesPath()}&rbf=0`);
        const buckets = this.ceFirst.fetch();
        early = Promise.all([buckets, loadPlotly()]).then(() => this.drawBucketsFirst(), () => null);
        // the outline (a pass over the run's steps, on a long run the longest read) once the
        // buckets are answered (a few ms): on 2 cores it would slow them down, not come sooner
        await buckets.catch(() => null);
      }
      try {
        if (await this.outline.fetch()) this.dirty = true;
      } catch (e) {
        if (e.status !== 404) throw e;
        // not (yet) in the store: say so, and keep polling (a follower may start it)
        $("run-facts").replaceChildren(el("p", { class: "note", data: { missing: "run" } }, `No run ${this.run} in the store (yet).`));
        state.missing = true;
        $("run-view").classList.add("missing"); // no empty chart frames: only the name and this note
        state.ready = true;
        return;
      }
      state.missing = false;
      $("run-view").classList.remove("missing");
      if (early) await early;
      if (this.summary === undefined) this.decide(this.outline.data);
      if (this.summary && (await this.ceSeries.fetch())) this.dirty = true;
      if (this.ceSeries && this.ceSeries.data) this.ceFirst = null; // the full answer replaces it
      if (this.summary) this.drawCeFirst(); // the buckets and the outline are all it draws from
      if (await this.series.poll()) this.dirty = true;
      state.stepsMs = Math.round(performance.now() - t0);
      this.drawCeFirst();
      if (this.series.needsReload(this.outline.data) && Date.now() - this.series.loadedAt > RELOAD_MS) {
        await this.series.load();
        this.dirty = true;
      }
      if (await this.findings.fetch()) this.dirty = true;
      try {
        if (await this.config.fetch()) this.dirty = true;
      } catch (e) {
        if (e instanceof AuthNeeded) throw e;
        this.config.data = null; // an older server without the route: no diff
      }
      try {
        if (await this.pace.fetch()) this.dirty = true;
      } catch (e) {
        if (e instanceof AuthNeeded) throw e;
        this.pace.data = null; // an older server without the route: no panel
      }
      if (Date.now() - this.goodputAt > GOODPUT_MS) {
        this.goodputAt = Date.now();
        // it reads every step of the run: drawn when it comes, the rest of the page not kept waiting
        this.goodput.fetch().then((changed) => {
          if (!changed) return;
          this.dirty = true;
          this.draw();
        }, (e) => report(e));
      }
      if (await this.pollEvents()) this.dirty = true;
      if (await this.overview.fetch()) this.dirty = true;
      if (this.control) {
        try {
          if (await this.controlOutline.fetch()) this.dirty = true;
          if (await this.control.poll()) this.dirty = true;
          if (this.controlError) this.dirty = true;
          this.controlError = null;
        } catch (e) {
          if (e instanceof AuthNeeded) throw e;
          if (this.controlError === null) this.dirty = true;
          this.controlError = String(e.message || e); // the run itself is still drawn
        }
      }
      this.draw();
    }

    // A long run: CE from /series, and the steps read from its last TAIL ones.
    decide(outline) {
      const incs = outline.incarnations.filter((i) => i.hi !== null);
      const total = incs.reduce((n, i) => n + i.steps, 0);
      this.summary = total > SUMMARY_STEPS;
      if (!this.summary) return;
      const last = incs[incs.length - 1];
      this.series.from = `${last.incarnation}:${Math.max(-1, last.hi - TAIL)}`;
    }
    seriesPath() {
      const range = this.zoom ? `&from=${this.zoom[0]}&to=${this.zoom[1]}` : "";
      return `${this.base}/series?buckets=${this.buckets}${range}`;
    }
    // plotly's zoom (relayout) as a step range: [from, to], null for the whole run (a double
    // click), undefined when the event is no change of the x range. On the time axes the range
    // is mapped back to the steps drawn in it (every incarnation's: a replay after a resume
    // from zero is a later time of the same steps).
    stepRangeOf(ev) {
      let range;
      if (ev["xaxis.autorange"]) return null;
      if (ev["xaxis.range[0]"] !== undefined) range = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
      else if (Array.isArray(ev["xaxis.range"])) range = ev["xaxis.range"];
      else return undefined;
      if (this.xMode !== "step" && state.aids && state.aids.timed) {
        const ms = range.map((v) => this.xMode === "time" ? (typeof v === "number" ? v : Date.parse(`${String(v).replace(" ", "T")}Z`))
                                                           : this.timeOrigin + Number(v) * 3600e3);
        range = this.stepsBetween(Math.min(...ms), Math.max(...ms));
        if (!range) return undefined; // nothing drawn in it: keep what is shown
      }
      const a = Math.max(-1, Math.floor(Math.min(range[0], range[1])));
      return [a, Math.max(a, Math.ceil(Math.max(range[0], range[1])))];
    }
    // the first and last step stamped between two times (ms), from the buckets or the rows
    stepsBetween(ta, tb) {
      let lo = Infinity;
      let hi = -Infinity;
      if (this.summary) {
        // the zoomed buckets when the time range is inside them (finer), else the whole run's
        const zoomed = this.bucketed().flatMap((i) => i.rows).filter((b) => b.t0_ns !== null);
        const inside = zoomed.length && ta >= Math.min(...zoomed.map((b) => b.t0_ns / 1e6)) &&
          tb <= Math.max(...zoomed.map((b) => b.t1_ns / 1e6));
        const whole = this.zoom && !inside && this.unzoomed ? this.bucketed(this.unzoomed) : this.bucketed();
        for (const inc of whole)
          for (const b of inc.rows) {
            if (b.t0_ns === null || b.t1_ns / 1e6 < ta || b.t0_ns / 1e6 > tb) continue;
            lo = Math.min(lo, b.s0);
            hi = Math.max(hi, b.s1);
          }
      } else
        for (const inc of this.series.incs.values())
          inc.ts.forEach((t, k) => {
            if (t === null || t < ta || t > tb) return;
            lo = Math.min(lo, inc.steps[k]);
            hi = Math.max(hi, inc.steps[k]);
          });
      return lo <= hi ? [lo, hi] : null;
    }
    // A zoom asks /series for that step range (on any x axis), at a bucket per pixel again, so
    // that a zoom deep enough shows every step; a double click asks for the whole run again.
    // The per-layer RBF panel, when open, follows the range.
    async zoomed(ev) {
      const zoom = this.stepRangeOf(ev);
      if (zoom === undefined || JSON.stringify(zoom) === JSON.stringify(this.visible)) return;
      this.visible = zoom;
      if ($("rbf-panel").open) this.loadRbfLayers().catch(report);
      if (!this.summary) return; // every step is read already
      if (!this.zoom && this.ceSeries && this.ceSeries.data) this.unzoomed = this.ceSeries.data; // to zoom out by time
      this.zoom = zoom;
      this.ceSeries = new Tagged(this.seriesPath());
      try {
        await this.ceSeries.fetch();
        state.zooms = (state.zooms || 0) + 1;
        this.dirty = true;
        this.draw();
      } catch (e) {
        report(e);
      }
    }
    // Per-layer REQUIRED_RBF, read only when the panel is opened (its arrays are most of a
    // run's bytes), for the step range on screen: each layer's largest value per bucket.
    async loadRbfLayers() {
      const range = this.visible ? `&from=${this.visible[0]}&to=${this.visible[1]}` : "";
      const t = new Tagged(`${this.base}/rbf-layers?buckets=${RBF_BUCKETS}${range}`);
      this.rbfLayers = t;
      await t.fetch();
      if (this.rbfLayers !== t) return; // another range was asked meanwhile
      const d = t.data;
      const traces = d.incarnations.map((inc, k) => ({
        type: "heatmap", name: `#${inc.incarnation}`, colorscale: "YlOrRd", showscale: k === 0,
        x: inc.rows.map((r) => (r[2] + r[3]) / 2), y: [...Array(d.layers).keys()],
        z: [...Array(d.layers).keys()].map((j) => inc.rows.map((r) => r[5][j] ?? null)),
        text: [...Array(d.layers).keys()].map((j) => inc.rows.map((r) => plain(`#${inc.incarnation} steps ${stepRange(r[2], r[3])} (${r[1]} read)`))),
        hovertemplate: `%{text}<br>layer %{y}: %{z}<extra></extra>`, zsmooth: false,
      }));
      const layout = { margin: { l: 64, r: 16, t: 10, b: 40 }, xaxis: { title: { text: "step" } },
                       yaxis: { title: { text: "layer" } } };
      if (window.Plotly) Plotly.react($("rbf-layers-chart"), traces, layout, PLOT_CONFIG);
      const rows = d.incarnations.reduce((n, i) => n + i.rows.reduce((m, r) => m + r[1], 0), 0);
      setText("rbf-layers-note", d.from === null ? "This run logs no REQUIRED_RBF line." :
        `steps ${stepRange(d.from, d.to)}, ${d.layers} layers, ${rows} rows read` +
        (d.stride > 1 ? ` (every ${d.stride}th step: zoom in for every step)` : "") + "; each layer's largest value per bucket");
      state.rbfLayers = { from: d.from, to: d.to, stride: d.stride, width: d.width, layers: d.layers, rows,
                          asked: (state.rbfLayers ? state.rbfLayers.asked : 0) + 1 };
    }
    // /series' buckets as {n, rows: [{k, n, s0, s1, ce_min, …}]} per incarnation
    bucketed(data) {
      const sd = data || (this.ceSeries && this.ceSeries.data) || (this.ceFirst && this.ceFirst.data);
      if (!sd) return [];
      return sd.incarnations.map((i) => ({
        n: i.incarnation,
        rows: i.rows.map((r) => Object.fromEntries(sd.columns.map((c, k) => [c, r[k]]))),
      }));
    }
    totalSteps() {
      const o = this.outline.data;
      return this.summary && o ? o.incarnations.reduce((n, i) => n + i.steps, 0) : this.series.rows;
    }

    // A long run's NaNs and REQUIRED_RBF coverage, from its buckets (a bucket: its step span).
    deriveSummary(outline) {
      const nan = [];
      const covered = [];
      const missing = [];
      const join = (list, n, b) => {
        const r = list[list.length - 1];
        if (r && r.incarnation === n && r.next === b.k) [r.last, r.next] = [b.s1, b.k + 1];
        else list.push({ incarnation: n, first: b.s0, last: b.s1, next: b.k + 1 });
      };
      const rbfLogged = outline.incarnations.some((i) => i.rbf_steps > 0);
      const rbfRows = outline.incarnations.reduce((n, i) => n + (i.rbf_steps || 0), 0);
      const incs = this.bucketed();
      incs.forEach((inc, j) => {
        let prev = null;
        for (const b of inc.rows) {
          if (b.nan_step !== null) {
            const y = b.ce_min ?? (prev && prev.ce_last);
            nan.push({ incarnation: inc.n, step: b.nan_step, raw: b.nan_step === b.s1 ? b.ce_last_raw : "non-finite", y });
          }
          if (b.rbf === null) continue; // asked without the REQUIRED_RBF counts (the first draw)
          if (b.rbf > 0) join(covered, inc.n, b);
          // the run's very last row may have its REQUIRED_RBF line in the next commit: not missing yet
          const lastOfRun = j === incs.length - 1 && b === inc.rows[inc.rows.length - 1];
          if (rbfLogged && b.rbf < b.n - (lastOfRun ? 1 : 0)) join(missing, inc.n, b);
          prev = b;
        }
      });
      const strip = (list) => list.map(({ incarnation, first, last }) => ({ incarnation, first, last }));
      return { outline, nan, covered: strip(covered), missing: strip(missing), rbfLogged, rbfRows };
    }

    // -- what is drawn, derived from the rows and the outline
    derive() {
      if (this.summary) return this.deriveSummary(this.outline.data || { incarnations: [], gaps: [], restores: [], stream_gaps: [] });
      const s = this.series;
      const outline = this.outline.data || { incarnations: [], gaps: [], restores: [], stream_gaps: [] };
      const nan = [];
      const covered = [];
      const missing = [];
      let rbfLogged = false;
      let rbfRows = 0;
      for (const inc of s.incs.values()) {
        inc.ce.forEach((v, k) => {
          if (v === null) nan.push({ incarnation: inc.n, step: inc.steps[k], raw: inc.raw[k], index: k });
        });
        if (inc.rbf.some(Boolean) || inc.rbfOnly.length) rbfLogged = true;
      }
      for (const inc of s.incs.values()) {
        const have = inc.steps.filter((_, k) => inc.rbf[k]).concat(inc.rbfOnly).sort((a, b) => a - b);
        rbfRows += have.length;
        // the run's very last row may have its REQUIRED_RBF line in the next commit: not missing yet
        const lacking = inc.steps.filter(
          (st, k) => !inc.rbf[k] && !(s.last && s.last[0] === inc.n && s.last[1] === st)
        );
        for (const [a, b] of ranges(have)) covered.push({ incarnation: inc.n, first: a, last: b });
        if (rbfLogged) for (const [a, b] of ranges(lacking)) missing.push({ incarnation: inc.n, first: a, last: b });
      }
      return { outline, nan, covered, missing, rbfLogged, rbfRows };
    }

    render() {
      const t0 = performance.now();
      const d = this.derive();
      const s = this.series;
      const findings = (this.findings.data && this.findings.data.findings) || [];
      const runs = (this.overview.data && this.overview.data.runs) || [];
      const me = runs.find((r) => r.run === this.run);
      this.revision += 1;
      this.renderCe(d, findings);
      this.renderParts(d);
      this.renderFacts(d, me);
      this.renderOverlay(runs);
      this.renderTables(d, findings);
      this.renderEvents();
      this.renderGoodput();
      this.renderPace();
      this.renderConfig();
      const lastInc = s.last ? s.incs.get(s.last[0]) : null;
      Object.assign(state, {
        ready: true,
        renders: state.renders + 1,
        steps: this.totalSteps(),
        summary: this.summary
          ? { buckets: this.buckets, zoom: this.zoom, width: this.ceSeries.data && this.ceSeries.data.width,
              drawn: this.bucketed().reduce((n, i) => n + i.rows.length, 0), tail: s.rows }
          : null,
        last: s.last ? { incarnation: s.last[0], step: s.last[1] } : null,
        lastCe: lastInc && lastInc.raw.length ? lastInc.raw[lastInc.raw.length - 1] : null,
        incarnations: [...s.incs.keys()],
        gaps: d.outline.gaps,
        nanSteps: d.nan.map(({ incarnation, step, raw }) => ({ incarnation, step, raw })),
        restores: d.outline.restores,
        findings: findings.map((f) => ({
          kind: f.kind, severity: f.severity, incarnation: f.incarnation, first_step: f.first_step, last_step: f.last_step,
        })),
        rbf: { logged: d.rbfLogged, rows: d.rbfRows, covered: d.covered, missing: d.missing },
        parts: s.partKeys,
        part: this.part,
        overlay: this.control ? { run: this.vs, steps: this.control.rows } : null,
        state: me ? me.state : null,
        goodput: this.goodput.data,
        renderMs: Math.round(performance.now() - t0),
      });
    }

    // The Config params that differ between two incarnations of the run (by default the
    // latest against the one before): what a restart changed, e.g. a batch size or a parallelism.
    renderConfig() {
      const incs = (this.config.data && this.config.data.incarnations) || [];
      const byInc = new Map(incs.map((i) => [i.incarnation, i.params]));
      const ids = incs.map((i) => i.incarnation);
      for (const id of ["config-a", "config-b"]) {
        const select = $(id);
        if ([...select.options].map((o) => Number(o.value)).join() !== ids.join())
          select.replaceChildren(...ids.map((n) => el("option", { value: String(n) }, `#${n}`)));
        select.disabled = ids.length < 2;
      }
      let pick = this.configPick && this.configPick.every((n) => byInc.has(n)) ? this.configPick : null;
      if (!pick && ids.length >= 2) pick = [ids[ids.length - 1], ids[ids.length - 2]];
      const rows = [];
      if (pick) {
        [$("config-a").value, $("config-b").value] = pick.map(String);
        const [a, b] = pick.map((n) => byInc.get(n));
        for (const name of [...new Set([...Object.keys(a), ...Object.keys(b)])].sort())
          if (a[name] !== b[name]) rows.push([name, a[name] ?? null, b[name] ?? null]);
      }
      $("inc-config-table").hidden = rows.length === 0;
      fill($("inc-config-table").tBodies[0], rows.map(([name, a, b]) => el("tr", { data: { param: name } },
        el("td", {}, name), el("td", {}, a ?? "(not printed)"), el("td", {}, b ?? "(not printed)"))));
      setText("inc-config-note", ids.length < 2
        ? (ids.length ? "Only one incarnation printed its Config params." : "No Config param lines in this run's log.")
        : pick[0] === pick[1] ? "The same incarnation on both sides."
          : rows.length ? `#${pick[0]} against #${pick[1]}: ${rows.length} param${rows.length === 1 ? "" : "s"} differ${rows.length === 1 ? "s" : ""}`
            : `#${pick[0]} against #${pick[1]}: no Config param differs.`);
      state.configDiff = pick ? { a: pick[0], b: pick[1], rows } : null;
    }

    gapShapes(gaps) {
      const shapes = [];
      for (const g of gaps) {
        const fill = GAP_FILL[g.kind] || GAP_FILL.gap;
        shapes.push({
          type: "rect", xref: "x", yref: "y domain", x0: g.first_step - 0.5, x1: g.last_step + 0.5, y0: 0, y1: 1,
          fillcolor: fill, line: { width: 1, color: fill.replace(/[\d.]+\)$/, "0.7)") }, layer: "below",
        });
      }
      return shapes;
    }

    renderCe(d, findings) {
      const s = this.series;
      const traces = [];
      const incs = this.summary ? this.bucketed().filter((i) => i.rows.length) : [...s.incs.values()].filter((i) => i.steps.length);
      if (this.summary) incs.forEach((inc, k) => traces.push(...this.bucketTraces(inc, COLORS[k % COLORS.length])));
      else
        incs.forEach((inc, k) => {
          const { x, y } = broken(inc.steps, inc.ce);
          traces.push({
            type: "scatter", mode: inc.steps.length > 600 ? "lines" : "lines+markers", name: `#${inc.n}`, x, y,
            line: { color: COLORS[k % COLORS.length], width: 1.6 }, marker: { size: 3 }, connectgaps: false,
            hovertemplate: `#${inc.n} step %{x}<br>ce %{y}<extra></extra>`,
          });
        });
      if (this.control && this.control.rows) {
        const byStep = this.control.latestCe();
        const steps = [...byStep.keys()].sort((a, b) => a - b);
        const { x, y } = broken(steps, steps.map((st) => byStep.get(st)));
        traces.push({
          type: "scatter", mode: "lines", name: `control: ${plain(this.vs)}`, x, y, connectgaps: false,
          line: { color: "#6b7280", width: 1.4, dash: "dash" },
          hovertemplate: `control step %{x}<br>ce %{y}<extra></extra>`,
        });
      }
      // non-finite CE: a marker at the CE just before it (the value itself is not a number)
      if (d.nan.length) {
        const x = [];
        const y = [];
        const text = [];
        for (const n of d.nan) {
          let v = n.y ?? null;
          if (n.y === undefined) {
            const inc = s.incs.get(n.incarnation);
            const k = n.index;
            for (let j = k - 1; j >= 0 && v === null; j--) v = inc.ce[j];
            for (let j = k + 1; j < inc.ce.length && v === null; j++) v = inc.ce[j];
          }
          x.push(n.step);
          y.push(v);
          text.push(plain(`#${n.incarnation} step ${n.step}: ce ${n.raw}`));
        }
        traces.push({
          type: "scatter", mode: "markers", name: "non-finite CE", x, y, text,
          marker: { symbol: "x-thin-open", size: 14, color: "#d62728", line: { width: 3, color: "#d62728" } },
          hovertemplate: "%{text}<extra></extra>",
        });
      }
      // the strip below: REQUIRED_RBF coverage (row 0), findings (row 1)
      const strip = (name, items, row, color, label) => {
        const x = [];
        const y = [];
        const text = [];
        for (const it of items) {
          const t = plain(label(it));
          x.push(it.first - 0.5, it.last + 0.5, null);
          y.push(row, row, null);
          text.push(t, t, null);
        }
        if (x.length)
          traces.push({
            type: "scatter", mode: "lines", name, x, y, text, yaxis: "y2", showlegend: false,
            line: { color, width: 9 }, hovertemplate: "%{text}<extra></extra>",
          });
      };
      const pointsOf = (name, items, row, color, symbol, label) => {
        if (!items.length) return;
        traces.push({
          type: "scatter", mode: "markers", name, yaxis: "y2", showlegend: false,
          x: items.map((it) => it.first), y: items.map(() => row), text: items.map((it) => plain(label(it))),
          marker: { color, size: 9, symbol }, hovertemplate: "%{text}<extra></extra>",
        });
      };
      const rbfLabel = (it) => `REQUIRED_RBF logged: #${it.incarnation} ${stepRange(it.first, it.last)}`;
      const lackLabel = (it) => `REQUIRED_RBF missing: #${it.incarnation} ${stepRange(it.first, it.last)}`;
      strip("RBF logged", d.covered, 0, "#2ca02c", rbfLabel);
      strip("RBF missing", d.missing, 0, "#d62728", lackLabel);
      pointsOf("RBF missing", d.missing, 0, "#d62728", "square", lackLabel);
      const stepped = findings.filter((f) => f.first_step >= 0);
      for (const sev of ["warning", "critical"]) {
        const items = stepped
          .filter((f) => (sev === "critical") === (f.severity === "critical"))
          .map((f) => ({ first: f.first_step, last: f.last_step, f }));
        const label = (it) => `${it.f.severity} ${it.f.kind} #${it.f.incarnation} ${stepRange(it.first, it.last)}: ${it.f.detail}`;
        strip(`${sev} findings`, items, 1, SEVERITY[sev], label);
        pointsOf(`${sev} findings`, items, 1, SEVERITY[sev], "triangle-down", label);
      }

      const shapes = this.gapShapes(d.outline.gaps);
      const annotations = [];
      for (const r of d.outline.restores) {
        const k = incs.findIndex((i) => i.n === r.incarnation);
        const color = COLORS[(k < 0 ? 0 : k) % COLORS.length];
        shapes.push({
          type: "line", xref: "x", yref: "y domain", x0: r.step + 0.5, x1: r.step + 0.5, y0: 0, y1: 1,
          line: { color, width: 1.5, dash: "dash" },
        });
        annotations.push({
          xref: "x", yref: "y domain", x: r.step + 0.5, y: 1, yanchor: "top", xanchor: "left", showarrow: false,
          font: { size: 11, color }, bgcolor: "rgba(255,255,255,0.85)",
          text: r.restored_from !== null ? `↩ #${r.incarnation} from ckpt ${r.restored_from}` : `↺ #${r.incarnation} restart at ${r.first_step}`,
        });
      }
      if (d.nan.length <= MAX_LINES)
        for (const n of d.nan)
          shapes.push({
            type: "line", xref: "x", yref: "y domain", x0: n.step, x1: n.step, y0: 0, y1: 1,
            line: { color: "rgba(214,39,40,0.6)", width: 1, dash: "dot" },
          });
      for (const g of d.outline.gaps)
        annotations.push({
          xref: "x", yref: "y domain", x: (g.first_step + g.last_step) / 2, y: 0, yanchor: "bottom",
          showarrow: false, font: { size: 10, color: "#b3261e" },
          text: g.first_step === g.last_step ? `gap ${g.first_step}` : `gap ${g.first_step}–${g.last_step}`,
        });
      const layout = {
        uirevision: this.run, datarevision: this.revision,
        margin: { l: 64, r: 16, t: 30, b: 46 },
        hovermode: "closest", showlegend: true,
        legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom", bgcolor: "rgba(255,255,255,0.8)" },
        xaxis: { title: { text: "step" }, anchor: "y2", zeroline: false },
        yaxis: { title: { text: "CE" }, domain: [0.2, 1], zeroline: false },
        yaxis2: {
          domain: [0, 0.12], range: [-0.7, 1.7], tickvals: [0, 1], ticktext: ["RBF", "findings"],
          fixedrange: true, showgrid: false, zeroline: false,
        },
        shapes, annotations,
      };
      this.readingAids(traces, layout, d);
      Plotly.react($("ce-chart"), traces, layout, PLOT_CONFIG);
      const chart = $("ce-chart");
      if (!this.zoomHooked) {
        chart.on("plotly_relayout", (ev) => this.zoomed(ev));
        this.zoomHooked = true;
      }
      chart.dataset.steps = String(this.totalSteps());
      chart.dataset.gaps = String(d.outline.gaps.length);
      chart.dataset.nan = String(d.nan.length);
    }

    // Smoothing (an exponential moving average, as TensorBoard's, restarting after a break) with
    // the raw line kept faint beneath; a log y axis; x by wall-clock time or time since the
    // run's first step, where a replay after a resume from zero shows as the time it took.
    readingAids(traces, layout, d) {
      const ce = traces.filter((t) => /^#\d+$/.test(t.name));
      if (this.smooth > 0)
        for (const t of ce) {
          const y = [];
          let acc = null;
          let n = 0;
          for (const v of t.y) {
            if (v === null || v === undefined) {
              acc = null;
              n = 0;
              y.push(null);
              continue;
            }
            acc = acc === null ? 0 : acc;
            acc = this.smooth * acc + (1 - this.smooth) * v;
            n += 1;
            y.push(acc / (1 - Math.pow(this.smooth, n))); // debiased: the first points are not pulled to 0
          }
          const smoothed = { ...t, y, name: `${t.name} smoothed`, showlegend: false, mode: "lines",
                             hovertemplate: `${t.name} step %{x}<br>ce smoothed %{y:.6f}<extra></extra>` };
          delete smoothed.marker; // plotly refuses a key holding undefined
          traces.push(smoothed);
          t.opacity = 0.3;
        }
      if (this.logY) layout.yaxis.type = "log";
      state.aids = { x: this.xMode, smooth: this.smooth, log: this.logY, timed: null };
      setText("x-note", "");
      if (this.xMode === "step") return;
      // step -> ms, per incarnation, from the rows read (or the buckets' last timestamps)
      const times = new Map();
      if (this.summary)
        for (const inc of this.bucketed()) times.set(inc.n, new Map(inc.rows.map((b) => [b.s1, b.t1_ns === null ? null : b.t1_ns / 1e6])));
      else for (const inc of this.series.incs.values()) times.set(inc.n, new Map(inc.steps.map((st, k) => [st, inc.ts[k]])));
      // the first step's time: a bucket is drawn at its last step's, but stamped from its first
      const firsts = this.summary ? this.bucketed().flatMap((i) => i.rows.map((b) => b.t0_ns)).filter((v) => v !== null).map((v) => v / 1e6) : [];
      let t0 = Math.min(...firsts, ...[...times.values()].flatMap((m) => [...m.values()]).filter((v) => v !== null));
      // zoomed, the hours stay counted from the run's first step, not from the range's
      if (this.zoom && this.timeOrigin !== null) t0 = this.timeOrigin;
      else if (Number.isFinite(t0)) this.timeOrigin = t0;
      const timed = Number.isFinite(t0);
      state.aids.timed = timed;
      if (!timed) {
        setText("x-note", "this log has no timestamps: drawn by step");
        return;
      }
      setText("x-note", "gaps, NaN lines and the strip below are on the step axis");
      const scale = this.xMode === "time" ? (ms) => ms : (ms) => (ms - t0) / 3600e3;
      const kept = [];
      for (const t of traces) {
        const m = times.get(Number((t.name || "").replace(/^#(\d+).*$/, "$1")));
        if (!m || !/^#\d+/.test(t.name || "")) continue; // the control, the markers and the strip are by step
        let last = null;
        t.x = t.x.map((st) => {
          const ms = m.get(st);
          if (ms !== undefined && ms !== null) last = ms;
          return last === null ? null : scale(last);
        });
        t.hovertemplate = (t.hovertemplate || "").replace("step %{x}", this.xMode === "time" ? "%{x}" : "%{x:.2f} h");
        kept.push(t);
      }
      traces.splice(0, traces.length, ...kept);
      const o = d.outline;
      layout.shapes = [];
      layout.annotations = [];
      for (const inc of o.incarnations.slice(1)) {
        const at = parseTime(inc.first_ts || inc.started);
        if (Number.isNaN(at)) continue;
        layout.shapes.push({ type: "line", xref: "x", yref: "y domain", x0: scale(at), x1: scale(at), y0: 0, y1: 1,
                             line: { color: "#6b7280", width: 1.5, dash: "dash" } });
        layout.annotations.push({ xref: "x", yref: "y domain", x: scale(at), y: 1, yanchor: "top", xanchor: "left",
                                  showarrow: false, font: { size: 11 }, text: `#${inc.incarnation} starts at step ${inc.lo}` });
      }
      layout.xaxis = { ...layout.xaxis, type: this.xMode === "time" ? "date" : "linear",
                       title: { text: this.xMode === "time" ? "wall-clock time (UTC)" : "hours since the first step" } };
    }

    // One incarnation's buckets: the last CE of each (the line; broken where buckets are
    // missing) over a bar from its min to its max, so a spike shows however wide the bucket.
    bucketTraces(inc, color) {
      const x = [];
      const y = [];
      const text = [];
      const bx = [];
      const by = [];
      let prev = null;
      for (const b of inc.rows) {
        if (prev !== null && b.k > prev.k + 1) {
          x.push((prev.s1 + b.s0) / 2);
          y.push(null);
          text.push(null);
        }
        x.push(b.s1);
        y.push(b.ce_last);
        text.push(plain(b.s0 === b.s1 ? `#${inc.n} step ${b.s1}: ce ${b.ce_last_raw}` :
          `#${inc.n} steps ${b.s0}–${b.s1} (${b.n}): last ${b.ce_last_raw}, min ${b.ce_min}, max ${b.ce_max}`));
        if (b.ce_min !== null && b.ce_max !== b.ce_min) bx.push(b.s1, b.s1, null), by.push(b.ce_min, b.ce_max, null);
        prev = b;
      }
      return [
        { type: "scatter", mode: "lines", name: `#${inc.n} min–max`, x: bx, y: by, showlegend: false, hoverinfo: "skip",
          line: { color, width: 1 }, opacity: 0.35 },
        { type: "scatter", mode: inc.rows.length > 600 ? "lines" : "lines+markers", name: `#${inc.n}`, x, y, text,
          line: { color, width: 1.6 }, marker: { size: 3 }, connectgaps: false, hovertemplate: "%{text}<extra></extra>" },
      ];
    }

    renderParts(d) {
      const s = this.series;
      const keys = s.partKeys.filter((k) => k !== "ce");
      if (!this.part || !keys.includes(this.part)) this.part = this.varying(keys) || keys[0] || null;
      const select = $("part-select");
      if (select.options.length !== keys.length || [...select.options].some((o, k) => o.value !== keys[k]))
        select.replaceChildren(...keys.map((k) => el("option", { value: k }, k)));
      if (this.part) select.value = this.part;
      const traces = [];
      let words = 0;
      [...s.incs.values()].filter((i) => i.steps.length).forEach((inc, k) => {
        const values = inc.parts.map((p) => {
          const v = p[this.part];
          if (typeof v === "number") return v;
          if (v !== undefined) words += 1;
          return null;
        });
        const { x, y } = broken(inc.steps, values);
        traces.push({
          type: "scatter", mode: inc.steps.length > 600 ? "lines" : "lines+markers", name: `#${inc.n}`, x, y,
          line: { color: COLORS[k % COLORS.length], width: 1.4 }, marker: { size: 3 }, connectgaps: false,
          hovertemplate: `#${inc.n} step %{x}<br>${plain(this.part || "")} %{y}<extra></extra>`,
        });
      });
      setText("part-note", (this.part
        ? `${keys.length} loss part(s) besides ce` + (words ? `; ${words} value(s) not a finite number (not drawn)` : "")
        : "no loss parts besides ce") + (this.summary ? ` — the last ${s.rows} steps` : ""));
      const layout = {
        uirevision: this.run, datarevision: this.revision,
        margin: { l: 64, r: 16, t: 10, b: 40 }, hovermode: "closest",
        legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom" },
        xaxis: { title: { text: "step" }, zeroline: false },
        yaxis: { title: { text: plain(this.part || "") }, zeroline: false },
        shapes: this.gapShapes(d.outline.gaps),
      };
      Plotly.react($("parts-chart"), traces, layout, PLOT_CONFIG);
    }

    // the first part whose values move (a constant such as `weights` says little as a curve)
    varying(keys) {
      for (const k of keys) {
        const seen = new Set();
        for (const inc of this.series.incs.values())
          for (const p of inc.parts) if (typeof p[k] === "number") seen.add(p[k]);
        if (seen.size > 1) return k;
      }
      return null;
    }

    renderFacts(d, me) {
      const s = this.series;
      const missingSteps = d.outline.gaps.reduce((n, g) => n + g.last_step - g.first_step + 1, 0);
      const lastInc = s.last ? s.incs.get(s.last[0]) : null;
      const lastRaw = lastInc && lastInc.raw.length ? lastInc.raw[lastInc.raw.length - 1] : "";
      const lastTs = me ? me.last_ts || me.updated : null;
      const facts = [
        ["steps", this.totalSteps()],
        ["incarnations", s.incs.size],
        ["last step", s.last ? `${s.last[1]} (#${s.last[0]})` : "–"],
        ["last CE", lastRaw || "–"],
        ["last step age", (me && me.last_ts ? age(lastTs) : lastTs ? `${age(lastTs)} (written)` : "") || "–"],
        ["missing steps", missingSteps],
        ["non-finite CE", d.nan.length],
        ["REQUIRED_RBF", d.rbfLogged ? `${d.rbfRows} rows` : "not logged"],
      ];
      $("run-facts").replaceChildren(...facts.map(([k, v]) => el("div", { data: { fact: k } }, el("b", {}, v), el("span", {}, k))));
      const st = $("run-state");
      st.textContent = me ? me.state : "";
      st.className = `state ${me ? me.state : ""}`;
      st.title = me ? me.state_reason || "" : "";
      setText("run-source", me ? me.sources.join(", ") : "");
    }

    renderOverlay(runs) {
      const select = $("overlay-select");
      const names = runs.map((r) => r.run).filter((r) => r !== this.run);
      const want = ["", ...names];
      if (select.options.length !== want.length || [...select.options].some((o, k) => o.value !== want[k]))
        select.replaceChildren(el("option", { value: "" }, "none"), ...names.map((n) => el("option", { value: n }, n)));
      select.value = this.vs || "";
      let note = "";
      if (this.controlError) note = `control: ${this.controlError}`;
      else if (this.control && this.control.rows) {
        const mine = this.series.latestCe();
        const theirs = this.control.latestCe();
        let common = 0;
        let worst = null;
        let lastStep = null;
        for (const [st, v] of mine) {
          const w = theirs.get(st);
          if (w === undefined || v === null || w === null) continue;
          common += 1;
          const diff = v - w;
          if (worst === null || Math.abs(diff) > Math.abs(worst.diff)) worst = { st, diff };
          if (lastStep === null || st > lastStep.st) lastStep = { st, diff };
        }
        note = common
          ? `${common} common steps; ce − control at step ${lastStep.st}: ${lastStep.diff.toFixed(6)}; largest |Δ| ${Math.abs(worst.diff).toFixed(6)} at step ${worst.st}`
          : "no common steps";
        const hosts = (o) => {
          const incs = (o && o.incarnations) || [];
          return incs.length ? incs[incs.length - 1].process_count : null;
        };
        const a = hosts(this.outline.data);
        const b = hosts(this.controlOutline && this.controlOutline.data);
        if (a && b && a !== b) note += ` — slice shapes differ (${a} vs ${b} hosts): \`steptail compare\` refuses this pair`;
      }
      setText("overlay-note", note);
      $("overlay-note").classList.toggle("warn", note.includes("differ"));
    }

    // Step time, tokens/s or TFLOP/s per device by incarnation (MaxText's `completed step`
    // lines, /step-times): each bucket's mean, and a faint bar to its slowest/fastest step time.
    renderPace() {
      const p = this.pace.data;
      const key = this.paceKey;
      const traces = [];
      let rows = 0;
      ((p && p.incarnations) || []).forEach((inc, k) => {
        const color = COLORS[k % COLORS.length];
        const bs = inc.rows.map((r) => Object.fromEntries(p.columns.map((c, j) => [c, r[j]])));
        rows += bs.reduce((n, b) => n + b.n, 0);
        if (key === "seconds") {
          const bx = [];
          const by = [];
          for (const b of bs) if (b.seconds_min !== b.seconds_max) bx.push(b.s1, b.s1, null), by.push(b.seconds_min, b.seconds_max, null);
          traces.push({ type: "scatter", mode: "lines", x: bx, y: by, showlegend: false, hoverinfo: "skip",
                        line: { color, width: 1 }, opacity: 0.35, name: `#${inc.incarnation} min–max` });
        }
        traces.push({ type: "scatter", mode: bs.length > 600 ? "lines" : "lines+markers", name: `#${inc.incarnation}`,
                      x: bs.map((b) => b.s1), y: bs.map((b) => b[key]), line: { color, width: 1.4 }, marker: { size: 3 },
                      hovertemplate: `#${inc.incarnation} step %{x}<br>${key} %{y}<extra></extra>` });
      });
      setText("pace-note", rows ? `${rows} completed-step lines` + (p.width > 1 ? `, mean of each ${p.width} steps` : "")
                                : "no `completed step` lines in this run's log");
      state.pace = { key, rows, incarnations: traces.filter((t) => !t.name.includes("min")).map((t) => t.name) };
      const label = { seconds: "step time (s)", tokens_per_s: "tokens/s/device", tflops: "TFLOP/s/device" }[key];
      Plotly.react($("pace-chart"), traces, {
        uirevision: this.run, margin: { l: 64, r: 16, t: 10, b: 40 }, hovermode: "closest",
        legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom" },
        xaxis: { title: { text: "step" }, zeroline: false }, yaxis: { title: { text: label }, zeroline: false },
      }, PLOT_CONFIG);
    }

    // The collector events (health, not findings): no ETag, so changed when their text is.
    async pollEvents() {
      const before = JSON.stringify(this.events.data);
      try {
        await this.events.fetch();
      } catch (e) {
        if (e instanceof AuthNeeded) throw e; // the token: asked for as on every route
        this.events.data = null; // an older server without the route: the section says none
      }
      return JSON.stringify(this.events.data) !== before;
    }

    renderEvents() {
      const events = (this.events.data && this.events.data.collector_events) || [];
      $("events-empty").hidden = events.length > 0;
      $("events-table").hidden = events.length === 0;
      setText("events-count", events.length ? `(${events.length})` : "");
      fill(
        $("events-table").tBodies[0],
        events.map((e) =>
          el(
            "tr",
            { data: { kind: e.kind, open: String(e.open), lost: String(e.lost_steps) } },
            el("td", { class: e.lost_steps ? "sev-warning" : "" }, e.kind),
            el("td", {}, e.run ? e.source : `${e.source} (every run)`),
            el("td", {}, e.started),
            el("td", {}, e.cleared || "still open"),
            el("td", {}, e.lost_steps ? "yes (see the gap finding)" : "no"),
            el("td", { class: "detail" }, shortened(e.reason))
          )
        )
      );
    }

    // The goodput bar split by cause, and the step time of each incarnation.
    renderGoodput() {
      const g = this.goodput.data;
      if (!g) return;
      const fmt = (v, digits) => (v === null || v === undefined ? "—" : v.toFixed(digits));
      const bar = $("goodput-bar");
      const wall = g.wall_s;
      setText("goodput-summary", wall
        ? `goodput ${(100 * g.goodput).toFixed(1)}% of ${wall.toFixed(0)} s wall time`
        : "no wall time: the log has no timestamps (productive " + fmt(g.productive_s, 0) + " s)");
      bar.hidden = !wall;
      fill(bar, wall ? TIME_PARTS.filter(([k]) => g[k] > 0).map(([k, name]) => {
        const share = (100 * g[k]) / wall;
        return el("span", { class: `part-${name}`, title: `${name}: ${g[k].toFixed(1)} s (${share.toFixed(1)}%)`,
                            data: { part: name }, style: `width: ${share}%` }, share >= 8 ? name : "");
      }) : []);
      fill(
        $("step-time-table").tBodies[0],
        g.incarnations.map((i) =>
          el(
            "tr",
            { data: { incarnation: i.incarnation } },
            el("td", { class: "num" }, i.incarnation),
            el("td", { class: "num" }, fmt(i.median_step_s, 3)),
            el("td", { class: "num" }, fmt(i.step_s_mad, 3)),
            el("td", { class: "num" }, fmt(i.tokens_per_s_device, 1)),
            el("td", { class: "num" }, fmt(i.tflops_per_device, 2))
          )
        )
      );
    }

    renderTables(d, findings) {
      $("findings-empty").hidden = findings.length > 0;
      $("findings-table").hidden = findings.length === 0;
      setText("findings-count", findings.length ? `(${findings.length})` : "");
      fill(
        $("findings-table").tBodies[0],
        findings.map((f) =>
          el(
            "tr",
            { data: { kind: f.kind, severity: f.severity, first: f.first_step, last: f.last_step } },
            el("td", { class: `sev-${f.severity}` }, f.severity),
            el("td", {}, f.kind),
            el("td", { class: "num" }, f.incarnation || ""),
            el("td", { class: "steps" }, f.first_step < 0 ? "—" : stepRange(f.first_step, f.last_step)),
            el("td", { class: "detail", title: f.detected_at || "" }, shortened(f.detail))
          )
        )
      );
      const gaps = d.outline.gaps;
      $("gaps-empty").hidden = gaps.length > 0;
      $("gaps-table").hidden = gaps.length === 0;
      setText("gaps-count", gaps.length ? `(${gaps.length})` : "");
      fill(
        $("gaps-table").tBodies[0],
        gaps.map((g) =>
          el(
            "tr",
            { data: { gap: g.kind, incarnation: g.incarnation, first: g.first_step, last: g.last_step } },
            el("td", {}, g.kind === "head_gap" ? "head gap" : "gap"),
            el("td", { class: "num" }, g.incarnation),
            el("td", { class: "steps" }, stepRange(g.first_step, g.last_step)),
            el("td", { class: "num" }, g.last_step - g.first_step + 1)
          )
        )
      );
      const rbf = $("rbf-summary");
      if (!d.rbfLogged) rbf.textContent = "This run logs no REQUIRED_RBF line.";
      else if (!d.missing.length) rbf.textContent = `Every recorded step has its REQUIRED_RBF line (${d.rbfRows} rows).`;
      else
        rbf.textContent =
          `${d.rbfRows} rows; missing at ` +
          d.missing.map((m) => `#${m.incarnation} ${stepRange(m.first, m.last)}`).join(", ") + ".";
      rbf.dataset.missing = String(d.missing.length);

      const restores = new Map(d.outline.restores.map((r) => [r.incarnation, r]));
      fill(
        $("incarnations-table").tBodies[0],
        d.outline.incarnations.map((i) => {
          const r = restores.get(i.incarnation);
          const resumed = r ? (r.restored_from !== null ? `from checkpoint ${r.restored_from}` : `restart at step ${r.first_step}`) : "";
          return el(
            "tr",
            { data: { incarnation: i.incarnation } },
            el("td", { class: "num" }, i.incarnation),
            el("td", {}, i.lo === null ? "—" : `${i.lo}–${i.hi}`),
            el("td", { class: "num" }, i.steps),
            el("td", {}, resumed),
            el("td", { class: "num" }, i.process_count ?? ""),
            el("td", { class: "note", title: i.pod || "" }, i.started || i.first_ts || "")
          );
        })
      );

      const s = this.series;
      const lastInc = s.last ? s.incs.get(s.last[0]) : null;
      const parts = lastInc && lastInc.parts.length ? lastInc.parts[lastInc.parts.length - 1] : {};
      const step = lastInc && lastInc.steps.length ? lastInc.steps[lastInc.steps.length - 1] : null;
      fill(
        $("last-parts").tBodies[0],
        [
          el("tr", {}, el("th", {}, "step"), el("td", { class: "num" }, step === null ? "—" : `${step} (#${lastInc.n})`)),
          el("tr", {}, el("th", {}, "ce"), el("td", { class: "num" }, lastInc && lastInc.raw.length ? lastInc.raw[lastInc.raw.length - 1] : "—")),
          ...Object.entries(parts).map(([k, v]) =>
            el("tr", { data: { part: k } }, el("th", {}, k), el("td", { class: "num" }, v === null ? "null" : v))
          ),
        ]
      );

      const sg = d.outline.stream_gaps;
      $("stream-gaps-title").hidden = $("stream-gaps-table").hidden = sg.length === 0;
      fill(
        $("stream-gaps-table").tBodies[0],
        sg.map((g) => el("tr", {}, el("td", {}, g.stream), el("td", {}, g.start || ""), el("td", {}, g.end || ""), el("td", {}, g.reason)))
      );
    }
  }

  // -- several runs: `?runs=a,b,c&control=c` -------------------------------------------------
  // Each run's CE from /series (bounded whatever its length); against the control, /api/compare
  // (the CLI compare's Δ, tolerance and first step beyond it) and the config params that differ.
  class CompareView {
    constructor(runs, control) {
      this.runs = [...new Set(runs)];
      if (control && !this.runs.includes(control)) this.runs.push(control);
      this.control = control || null;
      this.arms = this.runs.filter((r) => r !== this.control);
      this.buckets = Math.min(4000, Math.max(200, Number(params.get("buckets")) || 1000));
      this.zoom = null; // [from, to]: the step range zoomed into (null: the whole runs)
      this.ask();
      this.missing = new Set();
    }
    // the runs' /series and the arms' /api/compare, of the zoomed range only when zoomed
    ask() {
      const range = this.zoom ? { from: String(this.zoom[0]), to: String(this.zoom[1]) } : {};
      const tol = params.get("tolerance");
      const series = (r) => `api/runs/${encodeURIComponent(r)}/series?${new URLSearchParams({ buckets: String(this.buckets), ...range })}`;
      const q = (arm) => new URLSearchParams({ arm, control: this.control, buckets: String(this.buckets), ...(tol ? { tolerance: tol } : {}), ...range });
      this.series = new Map(this.runs.map((r) => [r, new Tagged(series(r))]));
      this.compares = new Map(this.control ? this.arms.map((a) => [a, new Tagged(`api/compare?${q(a)}`)]) : []);
    }
    // A zoom of either chart (plotly's relayout) asks every run's CE and Δ again for that step
    // range, at the same number of buckets: a deep enough zoom shows every step. A double click
    // asks for the whole runs.
    async zoomed(ev) {
      let zoom;
      if (ev["xaxis.autorange"]) zoom = null;
      else if (ev["xaxis.range[0]"] !== undefined) zoom = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
      else if (Array.isArray(ev["xaxis.range"])) zoom = ev["xaxis.range"];
      else return;
      if (zoom) {
        const a = Math.max(-1, Math.floor(Math.min(zoom[0], zoom[1])));
        zoom = [a, Math.max(a, Math.ceil(Math.max(zoom[0], zoom[1])))];
      }
      if (JSON.stringify(zoom) === JSON.stringify(this.zoom)) return;
      this.zoom = zoom;
      this.ask();
      try {
        await this.update();
        state.zooms = (state.zooms || 0) + 1;
      } catch (e) {
        report(e);
      }
    }
    async start() {
      $("compare-view").hidden = false;
      state.view = "compare";
      setText("compare-runs", this.runs.join(", "));
      setText("crumb", `compare ${this.runs.join(", ")}`);
      document.title = `steptail: compare ${this.runs.join(", ")}`;
      await Promise.all([loadPlotly(), this.update()]);
      this.render();
    }
    async update() {
      let changed = false;
      for (const [run, t] of [...this.series, ...this.compares]) {
        try {
          if (await t.fetch()) changed = true;
          this.missing.delete(run);
        } catch (e) {
          if (e.status !== 404) throw e;
          if (!this.missing.has(run)) changed = true;
          this.missing.add(run);
        }
      }
      if (changed && window.Plotly && this.started) this.render();
    }
    color(run) {
      return run === this.control ? "#6b7280" : COLORS[this.arms.indexOf(run) % COLORS.length];
    }
    render() {
      const traces = [];
      // the control first and wide: an arm drawn on top of an identical control leaves it visible
      for (const run of [this.control, ...this.arms].filter(Boolean)) {
        const sd = this.series.get(run).data;
        if (!sd) continue;
        const isControl = run === this.control;
        sd.incarnations.forEach((inc, k) => {
          const rows = inc.rows.map((r) => Object.fromEntries(sd.columns.map((c, j) => [c, r[j]])));
          const x = [];
          const y = [];
          let prev = null;
          for (const b of rows) {
            if (prev !== null && b.k > prev.k + 1) x.push((prev.s1 + b.s0) / 2), y.push(null);
            x.push(b.s1);
            y.push(b.ce_last);
            prev = b;
          }
          traces.push({
            type: "scatter", mode: "lines", name: plain(isControl ? `control: ${run}` : run), x, y, connectgaps: false,
            legendgroup: run, showlegend: k === 0, opacity: isControl ? 0.45 : 1,
            line: isControl ? { color: this.color(run), width: 6, dash: "dash" } : { color: this.color(run), width: 1.6 },
            hovertemplate: `${plain(run)} #${inc.incarnation} step %{x}<br>ce %{y}<extra></extra>`,
          });
        });
      }
      const base = { margin: { l: 64, r: 16, t: 30, b: 40 }, hovermode: "closest", uirevision: "compare",
        legend: { orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom" } };
      // both charts show the same steps: the zoomed range, whichever of the two was zoomed, else
      // the runs' whole span (the Δ covers only the common steps: its own range would be narrower)
      const xs = traces.flatMap((t) => t.x).filter((v) => v !== null);
      const span = this.zoom ? [this.zoom[0] - 0.5, this.zoom[1] + 0.5] : xs.length ? [Math.min(...xs), Math.max(...xs)] : null;
      const xaxis = { title: { text: "step" }, ...(span ? { range: span } : { autorange: true }) };
      Plotly.react($("compare-chart"), traces, { ...base, xaxis, yaxis: { title: { text: "CE" } } }, PLOT_CONFIG);

      const deltas = [];
      const shapes = [];
      const annotations = [];
      const arms = [];
      const notes = [];
      for (const [arm, t] of this.compares) {
        const c = t.data;
        if (!c) continue;
        const item = { arm, refused: c.refused, first_divergent_step: c.summary ? c.summary.first_divergent_step : null,
                       summary: c.summary || null };
        arms.push(item);
        if (c.refused) {
          notes.push(`${arm}: not compared (${c.refused})`);
          continue;
        }
        const rows = c.delta.map((r) => Object.fromEntries(c.columns.map((k, j) => [k, r[j]])));
        const bx = [];
        const by = [];
        for (const r of rows) if (r.d_min !== null && r.d_min !== r.d_max) bx.push(r.s1, r.s1, null), by.push(r.d_min, r.d_max, null);
        deltas.push({ type: "scatter", mode: "lines", x: bx, y: by, showlegend: false, hoverinfo: "skip",
                      line: { color: this.color(arm), width: 1 }, opacity: 0.35 });
        deltas.push({ type: "scatter", mode: rows.length > 600 ? "lines" : "lines+markers", name: plain(`${arm} − control`),
                      x: rows.map((r) => r.s1), y: rows.map((r) => r.d_last), line: { color: this.color(arm), width: 1.6 },
                      marker: { size: 3 }, hovertemplate: `${plain(arm)} step %{x}<br>Δce %{y}<extra></extra>` });
        const s = c.summary;
        if (!shapes.length)  // the tolerance band (absolute part): |Δ| ≤ tolerance
          shapes.push({ type: "rect", xref: "x domain", yref: "y", x0: 0, x1: 1, y0: -s.tolerance, y1: s.tolerance,
                        fillcolor: "rgba(44,160,44,0.12)", line: { width: 0 }, layer: "below" });
        const first = s.first_divergent_step;
        if (first !== null) {
          shapes.push({ type: "line", xref: "x", yref: "y domain", x0: first, x1: first, y0: 0, y1: 1,
                        line: { color: this.color(arm), width: 1.5, dash: "dash" } });
          annotations.push({ xref: "x", yref: "y domain", x: first, y: 1, yanchor: "top", xanchor: "left", showarrow: false,
                             font: { size: 11, color: "#b3261e" }, text: plain(`${arm} beyond tolerance from step ${first}`) });
        }
        notes.push(`${arm}: ${s.steps_compared} common steps, largest |Δ| ${s.max_abs_delta === null ? "–" : s.max_abs_delta.toPrecision(3)}` +
                   (first === null ? `, within ±${s.tolerance} everywhere` : `, first beyond ±${s.tolerance}${s.rel ? ` + ${s.rel}×|ce|` : ""} at step ${first}`));
      }
      Plotly.react($("delta-chart"), deltas, { ...base, shapes, annotations, xaxis,
                                               yaxis: { title: { text: "Δce (arm − control)" }, zeroline: true } }, PLOT_CONFIG);
      const missing = [...this.missing];
      setText("compare-note", [
        this.control ? `control: ${this.control}` : "no control picked (&control=RUN): no Δ",
        ...(missing.length ? [`no run ${missing.join(", ")} in the store`] : []),
      ].join(" · "));
      setText("delta-note", notes.join("; "));

      const rows = [];
      const seen = new Set();
      for (const { arm } of arms) {
        const c = this.compares.get(arm).data;
        const cfg = c.config;
        for (const [name, a, b] of cfg.arm_vs_control)
          rows.push({ between: `${arm} #${cfg.arm_incarnation} vs ${this.control} #${cfg.control_incarnation}`, name, a, b });
        for (const d of cfg.incarnations) {
          const key = `${d.run}:${d.from}:${d.to}`;
          if (seen.has(key)) continue;
          seen.add(key);
          for (const [name, a, b] of d.params) rows.push({ between: `${d.run} #${d.to} vs #${d.from}`, name, a: b, b: a });
        }
      }
      $("config-empty").hidden = rows.length > 0;
      fill($("config-table").tBodies[0], rows.map((r) => el("tr", { data: { param: r.name } },
        el("td", {}, r.between), el("td", {}, r.name), el("td", {}, r.a ?? "(not printed)"), el("td", {}, r.b ?? "(not printed)"))));
      if (!this.zoomHooked) {
        for (const id of ["compare-chart", "delta-chart"]) $(id).on("plotly_relayout", (ev) => this.zoomed(ev));
        this.zoomHooked = true;
      }
      Object.assign(state, {
        ready: true, renders: state.renders + 1, runs: this.runs, control: this.control, missing, zoom: this.zoom,
        compare: arms, config: rows.map((r) => [r.between, r.name, r.a, r.b]),
      });
    }
  }

  // -- polling ----------------------------------------------------------------------------------
  let view = null;
  let timer = null;

  function report(e) {
    state.error = e ? String(e.message || e) : null;
    const status = $("status");
    status.classList.toggle("error", Boolean(e));
    if (e) status.textContent = e instanceof AuthNeeded ? "token needed" : `error: ${state.error} (retrying)`;
    else status.textContent = `updated ${new Date().toLocaleTimeString()} · every ${POLL_MS / 1000} s`;
  }

  async function tick() {
    timer = null;
    if (!document.hidden) {
      try {
        await view.update();
        state.polls += 1;
        report(null);
      } catch (e) {
        report(e);
        if (e instanceof AuthNeeded) return; // the token form starts again
      }
    }
    timer = setTimeout(tick, POLL_MS);
  }

  async function start() {
    if (timer) clearTimeout(timer);
    timer = null;
    const run = params.get("run");
    const runs = (params.get("runs") || "").split(",").map((r) => r.trim()).filter(Boolean);
    view = view || (runs.length ? new CompareView(runs, params.get("control"))
      : run ? new RunView(run, params.get("vs")) : new RunsView());
    try {
      if (!view.started) {
        view.started = true;
        await view.start();
      } else {
        await view.update();
      }
      report(null);
    } catch (e) {
      report(e);
      if (e instanceof AuthNeeded) {
        view.started = false; // the token form calls start() again
        return;
      }
    }
    timer = setTimeout(tick, POLL_MS);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && view && view.started && timer) {
      clearTimeout(timer);
      tick();
    }
  });
  start();
})();
