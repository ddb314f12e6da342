// orch dashboard. Case data comes from the JSON block and is only ever put on the page with
// textContent / attribute setters: never innerHTML (reasons and log tails are arbitrary text).
(function () {
  "use strict";
  // The page's data comes packed (orchestrator/dashboard/pack.py says how): unpack restores the
  // view model's case dicts, with what the packing left out filled back in.
  function unpack(d) {
    var P = d.packed;
    if (!P) return d;
    var S = P.strings, at = function (i) { return typeof i === "number" ? S[i] : i; };
    d.cases = d.cases.map(function (e) {
      var c = {};
      Object.keys(e).forEach(function (k) { c[k] = e[k]; });
      P.interned.forEach(function (f) { if (typeof c[f] === "number") c[f] = S[c[f]]; });
      c.axes = {};
      P.axis_names.forEach(function (n, i) { c.axes[n] = P.string_axes.indexOf(n) >= 0 ? at(e.a[i]) : e.a[i]; });
      delete c.a;
      if (c.cls === undefined) c.cls = c.state;
      var ran = c.state !== "pending" && c.state !== "missing";
      if (c.requested_mode === undefined && ran) c.requested_mode = c.axes.cudagraph_mode;
      if (c.repro === undefined && ran) c.repro = "orch repro " + c.id + " --matrix " + d.run.matrix;
      c.checks = (c.checks || []).map(function (row) {
        var k = {};
        P.check_fields.forEach(function (f, i) { k[f] = row[i] === undefined ? null : row[i]; });
        k.name = at(k.name); k.passed = !!k.passed;
        if (k.bitwise !== null) k.bitwise = !!k.bitwise;
        return k;
      });
      var t = {};
      (c.timings || []).forEach(function (v, i) { if (v !== null) t[P.timing_keys[i]] = v; });
      c.timings = t;
      c.speedup = t.eager_step_s && t.replay_step_s ? +(t.eager_step_s / t.replay_step_s).toFixed(2) : null;
      if (c.versions !== undefined) {
        var v = {};
        Object.keys(P.versions).forEach(function (k) { v[k] = P.versions[k]; });
        if (c.versions) Object.keys(c.versions).forEach(function (k) { v[k] = c.versions[k]; });
        c.versions = v;
      }
      c.history = c.history || { runs: [], streak: 0, streak_status: "", last_pass: null };
      ["reason", "change", "baseline", "provider", "graph_kind", "error_kind", "log_tail", "status"].forEach(function (f) {
        if (c[f] === undefined) c[f] = "";
      });
      c.downgraded = !!c.downgraded;
      return c;
    });
    delete d.packed;
    return d;
  }
  var DATA = unpack(JSON.parse(document.getElementById("orch-data").textContent));
  var LIVE = document.body.getAttribute("data-live") === "1";
  var MODE_ORDER = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"];
  // A cell shows the worst of its cases: this order, worst first.
  // A muted case (a known-failures entry with mute: true) is its own state, whatever its status:
  // it never gates, so it never looks like a gating error.
  var WORST = ["fail", "error", "timeout", "unverifiable", "not-run", "missing", "flaky", "pass-unverifiable", "known-fail", "muted", "pending", "pass", "skip"];
  var LETTER = { pass: "", fail: "F", error: "E", timeout: "T", flaky: "~", unverifiable: "U", "pass-unverifiable": "u", "known-fail": "K", muted: "M", "not-run": "N", skip: "S", pending: "…", missing: "?" };
  var STATE_HELP = { muted: "a known-failures entry with mute: true: runs and reports its own status, never gates" };
  var AXIS_CHOICES = [
    ["tp,cudagraph_mode", "tp × mode"], ["tp,cudagraph_mode,spec_tokens", "tp × mode × k"],
    ["attention,tp,cudagraph_mode", "family × tp × mode"], ["attention,tp,cudagraph_mode,spec_tokens", "family × tp × mode × k"],
    ["attention", "attention family"],
    ["kv_cache_dtype,batch", "kv dtype × batch"], ["tp", "tp"], ["spec_tokens", "k (spec tokens)"],
    ["cudagraph_mode", "mode"], ["kv_cache_dtype", "kv dtype"], ["batch", "batch"], ["backend", "backend"],
    ["seed", "seed"], ["tp,kv_cache_dtype", "tp × kv dtype"], ["cudagraph_mode,batch", "mode × batch"]
  ];
  var state = { selected: null, cell: null, version: DATA.version || null };

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      if (k === "class") e.className = attrs[k]; else e.setAttribute(k, attrs[k]);
    });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function $(id) { return document.getElementById(id); }
  function uniq(xs) { var s = []; xs.forEach(function (x) { if (s.indexOf(x) < 0) s.push(x); }); return s; }
  function axisSort(axis, vals) {
    if (axis === "tp" || axis === "seed" || axis === "spec_tokens") return vals.slice().sort(function (a, b) { return a - b; });
    if (axis === "cudagraph_mode") return vals.slice().sort(function (a, b) { return MODE_ORDER.indexOf(a) - MODE_ORDER.indexOf(b); });
    if (axis === "attention") return vals.slice().sort(function (a, b) { return (a === "gqa" ? 0 : 1) - (b === "gqa" ? 0 : 1) || String(a).localeCompare(String(b)); });
    if (axis === "kv_cache_dtype") return vals.slice().sort(function (a, b) { return (a === "auto" ? 0 : 1) - (b === "auto" ? 0 : 1) || String(a).localeCompare(String(b)); });
    return vals;
  }
  // All combinations of the axes' values that occur, in axis order: [[v1, v2], ...]
  function keysFor(axes, cases) {
    var combos = [[]];
    axes.forEach(function (axis) {
      var vals = axisSort(axis, uniq(cases.map(function (c) { return c.axes[axis]; })));
      var next = [];
      combos.forEach(function (p) { vals.forEach(function (v) { next.push(p.concat([v])); }); });
      combos = next;
    });
    var present = {};
    cases.forEach(function (c) { present[JSON.stringify(axes.map(function (a) { return c.axes[a]; }))] = true; });
    return combos.filter(function (k) { return present[JSON.stringify(k)]; });
  }
  function label(axes, key) {
    return key.map(function (v, i) {
      return axes[i] === "tp" ? "tp" + v : axes[i] === "spec_tokens" ? "k" + v : String(v);
    }).join(" · ");
  }

  function fillSelect(sel, options, value) {
    var cur = sel.value || value;
    while (sel.firstChild) sel.removeChild(sel.firstChild);
    options.forEach(function (o) { var opt = el("option", { value: o[0] }, o[1]); sel.appendChild(opt); });
    if (options.some(function (o) { return o[0] === cur; })) sel.value = cur;
  }

  function setupControls() {
    // A run with spec-decode cases splits rows by k, so a k = 2 failure never hides behind k = 0.
    // A run of several attention families (gqa, mla, ...) splits rows by family first.
    var withK = DATA.cases.some(function (c) { return c.axes.spec_tokens > 0; });
    var families = uniq(DATA.cases.map(function (c) { return c.axes.attention; }));
    fillSelect($("rows"), AXIS_CHOICES, (families.length > 1 ? "attention," : "") +
               (withK ? "tp,cudagraph_mode,spec_tokens" : "tp,cudagraph_mode"));
    fillSelect($("cols"), AXIS_CHOICES, "kv_cache_dtype,batch");
    var backends = uniq(DATA.cases.map(function (c) { return String(c.axes.backend); }));
    fillSelect($("f-backend"), [["", "all"]].concat(backends.map(function (b) { return [b, b]; })), "");
    var providers = uniq(DATA.cases.map(function (c) { return c.provider || ""; })).filter(Boolean);
    fillSelect($("f-provider"), [["", "all"]].concat(providers.map(function (p) { return [p, p]; })), "");
    var skipped = DATA.cases.filter(function (c) { return c.state === "skip"; }).length;
    $("skip-count").textContent = "(" + skipped + ")";
    var box = $("f-states");
    if (!box.firstChild) {
      DATA.states.filter(function (s) { return s !== "skip"; }).forEach(function (s) {
        var lab = el("label"); var cb = el("input", { type: "checkbox", value: s, "data-state": s });
        cb.checked = true; cb.addEventListener("change", renderGrid);
        lab.appendChild(cb); lab.appendChild(document.createTextNode(" " + s)); box.appendChild(lab);
      });
    }
    if (DATA.runs && DATA.runs.length) {
      var picker = $("run-picker"); picker.hidden = false;
      fillSelect(picker, DATA.runs.slice().reverse().map(function (r) { return [String(r.id), "run " + r.id + " (" + r.status + ")"]; }), String(DATA.run.id));
      picker.value = String(DATA.run.id);
    }
  }

  function visible(c) {
    var b = $("f-backend").value, p = $("f-provider").value, t = $("f-text").value.trim();
    if (b && String(c.axes.backend) !== b) return false;
    if (p && (c.provider || "") !== p) return false;
    if (t && c.id.indexOf(t) < 0) return false;
    if ($("f-changed").checked && !c.change) return false;
    // Skipped cases (cannot run here) are hidden unless asked for: they are no result.
    if (c.state === "skip") return $("f-skips").checked;
    var cb = document.querySelector('#f-states input[data-state="' + c.state + '"]');
    return !cb || cb.checked;
  }

  function renderHeader() {
    var g = DATA.gate, r = DATA.run;
    // The headline names the run and, unless it finished, its state (INTERRUPTED, RUNNING).
    var v = $("verdict"); v.textContent = DATA.headline || g.verdict;
    v.className = "verdict " + (DATA.state ? "state" : g.passed ? "ok" : "bad");
    $("run-id").textContent = String(r.id); $("run-matrix").textContent = r.matrix;
    var meta = ["status: " + r.status, "devices: " + (r.devices || "?"), r.git_sha ? "git: " + r.git_sha.slice(0, 12) : "git: not a checkout",
      "results: " + r.num_results + "/" + r.num_cases];
    if (r.selection) meta.unshift("selection: " + r.selection);
    if (r.started_at) meta.push("started: " + new Date(r.started_at * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z");
    if (r.label) meta.splice(1, 0, "label: " + r.label);
    if (r.device_model) meta.splice(2, 0, "device: " + r.device_model);
    if (g.baseline) meta.push(DATA.baseline_where ? "baseline: " + DATA.baseline_where : "with baseline");
    else if (DATA.baseline_note) meta.push(DATA.baseline_note);
    $("run-meta").textContent = meta.join(" · ");
    var counts = $("counts"); while (counts.firstChild) counts.removeChild(counts.firstChild);
    (DATA.classifications || Object.keys(g.counts)).forEach(function (k) { if (g.counts[k]) counts.appendChild(el("span", { "class": "count-" + k }, k + ": " + g.counts[k])); });
    if (g.downgraded.length) counts.appendChild(el("span", null, "downgraded: " + g.downgraded.length));
  }

  // "3 pass · 1 fail": the passes first, the worst last (where the eye ends), skips after all.
  var COUNT_ORDER = WORST.slice(0, -1).reverse().concat(["skip"]);
  function counts(cases) {
    var n = {};
    cases.forEach(function (c) { n[c.state] = (n[c.state] || 0) + 1; });
    return COUNT_ORDER.filter(function (s) { return n[s]; }).map(function (s) { return n[s] + " " + s; }).join(" · ");
  }

  // One button per cell: the worst state of its cases (colour), their counts ("3 pass · 1 fail").
  // A cell of one case is that case (data-case-id); a click on a cell of several lists them.
  function chip(cases, where) {
    var worst = WORST.filter(function (s) { return cases.some(function (c) { return c.state === s; }); })[0] || cases[0].state;
    var one = cases.length === 1 ? cases[0] : null;
    var text = counts(cases);
    var b = el("button", { type: "button", "class": "chip st-" + worst + (one ? "" : " multi"), "data-state": worst,
      "data-count": String(cases.length), "data-case-ids": cases.map(function (c) { return c.id; }).join(" "),
      title: one ? one.id + ": " + one.cls + (one.status ? " (" + one.status + ")" : "") + (one.reason ? " — " + one.reason : "") : where + ": " + text });
    if (one) b.setAttribute("data-case-id", one.id);
    b.appendChild(document.createTextNode(one ? (LETTER[worst] || "") : text));
    if (cases.some(function (c) { return c.downgraded; })) b.classList.add("downgraded");
    var change = ["regression", "new", "fixed"].filter(function (x) { return cases.some(function (c) { return c.change === x; }); })[0];
    if (change) {
      b.setAttribute("data-change", change);
      b.appendChild(el("span", { "class": "chg chg-" + change }, change === "regression" ? "▼" : change === "fixed" ? "▲" : "●"));
    }
    if (cases.some(function (c) { return c.id === state.selected; }) || state.cell === where) b.classList.add("selected");
    b.addEventListener("click", function () { if (one) showDetails(one.id); else showCell(where, cases); });
    return b;
  }

  function renderGrid() {
    var rows = $("rows").value.split(","), cols = $("cols").value.split(",");
    var table = $("grid"); while (table.firstChild) table.removeChild(table.firstChild);
    var rowKeys = keysFor(rows, DATA.cases), colKeys = keysFor(cols, DATA.cases);
    var cells = {};
    var shown = 0;
    DATA.cases.forEach(function (c) {
      if (!visible(c)) return;
      var k = JSON.stringify(rows.map(function (a) { return c.axes[a]; })) + "|" + JSON.stringify(cols.map(function (a) { return c.axes[a]; }));
      (cells[k] = cells[k] || []).push(c); shown++;
    });
    var thead = el("thead"), hr = el("tr");
    hr.appendChild(el("th", null, rows.join(" × ") + " \\ " + cols.join(" × ")));
    colKeys.forEach(function (k) { hr.appendChild(el("th", { scope: "col" }, label(cols, k))); });
    thead.appendChild(hr); table.appendChild(thead);
    var tbody = el("tbody");
    rowKeys.forEach(function (rk) {
      var tr = el("tr"); tr.appendChild(el("th", { "class": "row", scope: "row" }, label(rows, rk)));
      colKeys.forEach(function (ck) {
        var td = el("td"), cases = cells[JSON.stringify(rk) + "|" + JSON.stringify(ck)];
        if (cases) td.appendChild(chip(cases, label(rows, rk) + " / " + label(cols, ck)));
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    table.appendChild(tbody);
    $("empty").hidden = shown > 0;
  }

  function kv(table, k, v) {
    if (v === undefined || v === null || v === "") return;
    var tr = el("tr"); tr.appendChild(el("th", null, k)); tr.appendChild(el("td", null, v)); table.appendChild(tr);
  }
  function fmt(x) { return x === null || x === undefined ? "" : (typeof x === "number" ? (Math.abs(x) >= 1e-3 || x === 0 ? +x.toPrecision(4) : x.toExponential(2)) : String(x)); }

  function copyText(text, btn) {
    function done(ok) { btn.textContent = ok ? "copied" : "select and copy"; setTimeout(function () { btn.textContent = "copy"; }, 1500); }
    function fallback() {
      var ta = el("textarea"); ta.value = text; document.body.appendChild(ta); ta.select();
      var ok = false; try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      document.body.removeChild(ta); done(ok);
    }
    if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(text).then(function () { done(true); }, fallback);
    else fallback();
  }

  // A cell of several cases: which they are (provider, seed, k), each a link to its detail.
  function showCell(where, cases) {
    state.selected = null; state.cell = where;
    document.querySelectorAll(".chip.selected").forEach(function (b) { b.classList.remove("selected"); });
    var body = $("details-body"); while (body.firstChild) body.removeChild(body.firstChild);
    $("details").hidden = false;
    body.appendChild(el("h2", { id: "d-title" }, where));
    body.appendChild(el("p", { id: "d-counts" }, counts(cases)));
    var t = el("table", { id: "d-cell" }), h = el("tr");
    ["case", "backend", "provider", "seed", "k", "state"].forEach(function (x) { h.appendChild(el("th", null, x)); });
    t.appendChild(h);
    cases.slice().sort(function (a, b) { return WORST.indexOf(a.state) - WORST.indexOf(b.state) || (a.id < b.id ? -1 : 1); })
      .forEach(function (c) {
        var tr = el("tr", { "data-case-id": c.id }), link = el("button", { type: "button", "class": "case-link", "data-case-id": c.id }, c.id);
        link.addEventListener("click", function () { showDetails(c.id); });
        var cell = el("td"); cell.appendChild(link); tr.appendChild(cell);
        [c.axes.backend, c.provider || "", c.axes.seed, c.axes.spec_tokens].forEach(function (x) { tr.appendChild(el("td", null, x)); });
        tr.appendChild(el("td", { "class": "st-label" }, c.cls));
        t.appendChild(tr);
      });
    body.appendChild(t);
  }

  function showDetails(id) {
    var c = DATA.cases.filter(function (x) { return x.id === id; })[0];
    state.selected = id; state.cell = null;
    document.querySelectorAll(".chip.selected").forEach(function (b) { b.classList.remove("selected"); });
    var sel = document.querySelector('.chip[data-case-id="' + (window.CSS && CSS.escape ? CSS.escape(id) : id) + '"]');
    if (sel) sel.classList.add("selected");
    var body = $("details-body"); while (body.firstChild) body.removeChild(body.firstChild);
    $("details").hidden = false;
    if (!c) { body.appendChild(el("p", null, "case " + id + " is not in this run")); return; }
    body.appendChild(el("h2", { id: "d-title" }, c.id));
    body.appendChild(el("span", { "class": "badge st-" + c.state, id: "d-state" }, c.cls));
    if (c.status) body.appendChild(el("span", { id: "d-status" }, "  its own status: " + c.status + " (not gating)"));
    if (c.change) body.appendChild(el("span", { id: "d-change" }, "  " + (c.change === "regression" ? "▼ regression vs baseline (" + c.baseline + ")" : c.change === "fixed" ? "▲ fixed vs baseline" : "● new: not in baseline")));
    if (c.reason) body.appendChild(el("p", { id: "d-reason", "class": c.state === "pass" ? "" : "bad" }, c.reason));
    if (c.known) {
      var p = el("p", { id: "d-known" }, (c.known.mute ? "Muted (runs and reports, does not gate) until " + c.known.until + ": " : "Known failure: ") + c.known.reason + " ");
      // Only http(s) links become anchors: a javascript: URL from a YAML file must stay text.
      if (/^https?:\/\//i.test(c.known.link || "")) { var a = el("a", { href: c.known.link, rel: "noopener noreferrer" }, c.known.link); p.appendChild(a); }
      else if (c.known.link) p.appendChild(document.createTextNode(c.known.link));
      body.appendChild(p);
    }
    if (c.cls === "fixed") body.appendChild(el("p", { "class": "ok" }, "Known failure now passes: remove its entry."));
    var t = el("table", { id: "d-fields" });
    kv(t, "attention family", c.axes.attention || "gqa");
    kv(t, "k (spec tokens)", String(c.axes.spec_tokens || 0) + (c.axes.spec_tokens > 0 ? " (verify rows of " + (1 + c.axes.spec_tokens) + " tokens)" : ""));
    kv(t, "axes", Object.keys(c.axes).map(function (k) { return k + "=" + c.axes[k]; }).join("  "));
    kv(t, "mode", c.requested_mode ? (c.requested_mode + (c.downgraded ? " → " + c.resolved_mode + " (downgraded)" : " (resolved " + c.resolved_mode + ")")) : "");
    kv(t, "backend", String(c.axes.backend)); kv(t, "provider", c.provider); kv(t, "seed", String(c.axes.seed));
    kv(t, "graph kind", c.graph_kind);
    kv(t, "capture sizes", c.capture_sizes && c.capture_sizes.length ? c.capture_sizes.join(", ") + " (per step, 0 = eager)" : "");
    kv(t, "device", c.device); kv(t, "worker", c.worker); kv(t, "attempts", c.attempts); kv(t, "error kind", c.error_kind);
    body.appendChild(t);
    if (c.checks.length) {
      body.appendChild(el("h3", null, "checks"));
      var ct = el("table", { id: "d-checks" }), h = el("tr");
      ["check", "", "step", "max abs", "max rel", "mismatch", "first bad (row, head)", "bitwise"].forEach(function (x) { h.appendChild(el("th", null, x)); });
      ct.appendChild(h);
      c.checks.forEach(function (k) {
        var tr = el("tr", { "data-check": k.name, "class": k.passed ? "" : "bad" });
        [k.name, k.passed ? "ok" : "FAILED", k.step, fmt(k.max_abs), fmt(k.max_rel),
          k.mismatch === null || k.mismatch === undefined ? "" : (100 * k.mismatch).toFixed(1) + "%",
          k.first_bad ? "(" + k.first_bad.join(", ") + ")" : "", k.bitwise === null || k.bitwise === undefined ? "" : (k.bitwise ? "yes" : "no")
        ].forEach(function (x) { tr.appendChild(el("td", null, x)); });
        ct.appendChild(tr);
        if (k.detail) { var d = el("tr"); var td = el("td", { colspan: "8" }, k.detail); d.appendChild(td); ct.appendChild(d); }
      });
      body.appendChild(ct);
    }
    if (c.timings && Object.keys(c.timings).length) {
      body.appendChild(el("h3", null, "timings"));
      var tt = el("table", { id: "d-timings" });
      // Keys ending _s are seconds; the others (eager_shared_steps, ...) are counts.
      Object.keys(c.timings).forEach(function (k) { kv(tt, k, fmt(c.timings[k]) + (/_s$/.test(k) ? " s" : "")); });
      if (c.speedup) kv(tt, "replay speedup", c.speedup + "× vs eager");
      body.appendChild(tt);
    }
    if (c.memory && Object.keys(c.memory).length) {
      // Device memory of the case (bytes): peaks over the case, what its session holds.
      body.appendChild(el("h3", null, "device memory"));
      var mt = el("table", { id: "d-memory" });
      Object.keys(c.memory).forEach(function (k) { kv(mt, k.replace(/_/g, " "), (c.memory[k] / 1073741824).toFixed(2) + " GiB"); });
      body.appendChild(mt);
    }
    if (c.versions && Object.keys(c.versions).length) {
      body.appendChild(el("h3", null, "versions"));
      body.appendChild(el("p", { id: "d-versions" }, Object.keys(c.versions).map(function (k) { return k + " " + c.versions[k]; }).join(" · ")));
    }
    // Colour codes from worker logs are noise in a browser: drop them (the text stays text).
    if (c.log_tail) { body.appendChild(el("h3", null, "log tail")); body.appendChild(el("pre", { id: "d-log" }, c.log_tail.replace(/\x1b\[[0-9;]*[A-Za-z]/g, ""))); }
    if (c.repro) {
      body.appendChild(el("h3", null, "repro"));
      body.appendChild(el("pre", { id: "d-repro" }, c.repro));
      var btn = el("button", { type: "button", id: "d-copy" }, "copy");
      btn.addEventListener("click", function () { copyText(c.repro, btn); });
      body.appendChild(btn);
    }
    var hst = c.history || { runs: [] };
    body.appendChild(el("h3", null, "history"));
    // Each run of the (possibly shared) store with its label; streaks per device model below.
    var hp = el("p", { id: "d-history" }, hst.runs.length ?
      hst.runs.map(function (x) { return "run " + x[0] + (x[3] ? " [" + x[3] + "]" : "") + ": " + x[1]; }).join(" · ") : "no earlier results");
    body.appendChild(hp);
    var streak = function (h) { return h.streak_status + " for " + h.streak + " run(s); last pass: " + (h.last_pass === null ? "never" : "run " + h.last_pass); };
    if (hst.runs.length) body.appendChild(el("p", { id: "d-streak" }, streak(hst)));
    if (hst.by_device && hst.by_device.length > 1) {
      var dt = el("table", { id: "d-by-device" });
      hst.by_device.forEach(function (d) { kv(dt, d.device, streak(d) + " (" + d.runs.map(function (x) { return "run " + x[0] + ": " + x[1]; }).join(" · ") + ")"); });
      body.appendChild(dt);
    }
    if (c.flakiness) {
      var f = c.flakiness;
      body.appendChild(el("p", { id: "d-flaky", "class": f.score > 0 ? "bad" : "" }, "flakiness " + f.score.toFixed(2) +
        " over " + f.runs + " of the last " + f.window + " run(s)" + (f.label ? " labelled " + f.label : "") + ": " +
        f.flips + " pass/fail flip(s), " + f.retried + " flaky on retry"));
    }
  }

  function renderLegend() {
    var lg = $("legend"); while (lg.firstChild) lg.removeChild(lg.firstChild);
    DATA.states.forEach(function (s) {
      var b = el("span", { "class": "chip st-" + s, "data-legend": s, style: "display:inline-block;text-align:center;line-height:20px" }, LETTER[s] || "");
      if (STATE_HELP[s]) b.setAttribute("title", STATE_HELP[s]);
      lg.appendChild(b); lg.appendChild(document.createTextNode(" " + s + "  "));
    });
    lg.appendChild(document.createTextNode(" — a cell: its worst case, with counts when it has several · blue corner: mode " +
      "downgraded · ▼ regression · ▲ fixed · ● new vs baseline · skipped cases hidden unless shown"));
  }

  function renderAll() { setupControls(); renderHeader(); renderGrid(); renderLegend(); if (state.selected) showDetails(state.selected); }

  ["rows", "cols", "f-backend", "f-provider", "f-changed", "f-skips"].forEach(function (id) { $(id).addEventListener("change", renderGrid); });
  $("f-text").addEventListener("input", renderGrid);
  $("close-details").addEventListener("click", function () { $("details").hidden = true; state.selected = null; state.cell = null; renderGrid(); });
  $("run-picker").addEventListener("change", function () { location.search = "?run=" + encodeURIComponent(this.value); });
  renderAll();

  if (LIVE) {
    var q = "?run=" + encodeURIComponent(DATA.run.id);
    var status = $("live-status"); status.hidden = false; status.textContent = "live";
    var poll = function () {
      fetch("api/version" + q, { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (v) {
        if (state.version === null) { state.version = v.version; return; }
        if (v.version === state.version) return;
        state.version = v.version;
        return fetch("api/data" + q, { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (d) {
          DATA = unpack(d); renderAll(); status.textContent = "live · updated " + new Date().toLocaleTimeString();
        });
      }).catch(function () { status.textContent = "live · server unreachable"; });
    };
    poll(); setInterval(poll, 2000);
  }
  window.orchDashboard = { data: function () { return DATA; } };
})();
