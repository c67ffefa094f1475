"""The report's HTML page: `%TITLE%`, `%PLOTLYJS%` (plotly.js, inlined so the page works
offline) and `%DATA%` (the runs, as built by `build.run_view`) are filled in by `build.render`.

The script only switches between precomputed figures: moving the slider (`#run-slider`)
redraws every figure with `Plotly.react` and rewrites the numbers (`#stat-<key>`, each with
its raw value in `data-value`), so what the page shows is exactly what the runs recorded.
`body[data-ready]` is set once the selected run is drawn (the browser test waits for it).
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>%TITLE%</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px;
         color: #222; padding: 0 1em; }
  h1 { font-size: 1.4em; margin-bottom: 0.2em; }
  .sub { color: #666; margin-top: 0; }
  #banner { background: #fff3cd; border: 1px solid #e0c36a; padding: 0.6em 1em;
            border-radius: 6px; margin: 0.8em 0; }
  #slider-box { background: #f5f7fa; border-radius: 8px; padding: 0.8em 1em; margin: 1em 0; }
  #slider-box label { margin-right: 0.5em; }
  #run-slider { width: 100%; margin: 0.6em 0 0.2em 0; }
  #run-label { font-weight: 600; }
  .ticks { display: flex; justify-content: space-between; color: #666; font-size: 0.85em; }
  .stats { display: flex; flex-wrap: wrap; gap: 0.6em; margin: 1em 0; }
  .card { border: 1px solid #ddd; border-radius: 8px; padding: 0.5em 0.9em; min-width: 8em; }
  .card .k { color: #666; font-size: 0.8em; }
  .card .v { font-size: 1.4em; font-weight: 600; }
  .fig { margin: 0.5em 0 1.2em 0; }
  #notes { color: #555; font-size: 0.9em; }
  .hidden { display: none; }
</style>
</head>
<body>
<h1>%TITLE%</h1>
<p class="sub" id="run-dir"></p>
<div id="banner" class="hidden"></div>
<div id="slider-box" class="hidden">
  <div><label for="run-slider">sync &larr; max_policy_age &rarr; async:</label>
    <span id="run-label"></span></div>
  <input type="range" id="run-slider" min="0" max="0" step="1" value="0">
  <div class="ticks" id="ticks"></div>
</div>
<div class="stats">
  <div class="card"><div class="k">max_policy_age</div>
    <div class="v" id="stat-max_policy_age"></div></div>
  <div class="card"><div class="k">trained episodes/s</div>
    <div class="v" id="stat-episodes_per_s"></div></div>
  <div class="card"><div class="k">generated episodes trained on</div>
    <div class="v" id="stat-trained_share"></div></div>
  <div class="card"><div class="k">... dropped as too stale</div>
    <div class="v" id="stat-stale_share"></div></div>
  <div class="card"><div class="k">... filtered, dropped or lost</div>
    <div class="v" id="stat-other_share"></div></div>
  <div class="card"><div class="k">... held at the end</div>
    <div class="v" id="stat-held_share"></div></div>
  <div class="card"><div class="k">generator busy</div>
    <div class="v" id="stat-generator_busy"></div></div>
  <div class="card"><div class="k">trainer busy</div>
    <div class="v" id="stat-trainer_busy"></div></div>
  <div class="card"><div class="k">mean staleness (versions)</div>
    <div class="v" id="stat-staleness_mean"></div></div>
  <div class="card"><div class="k">batch cycle C (mean)</div>
    <div class="v" id="stat-cycle_ms"></div></div>
  <div class="card"><div class="k">train step T (mean)</div>
    <div class="v" id="stat-train_ms"></div></div>
  <div class="card"><div class="k">final reward (window)</div>
    <div class="v" id="stat-reward_final"></div></div>
  <div class="card"><div class="k">final evaluation</div>
    <div class="v" id="stat-eval_final"></div></div>
  <div class="card"><div class="k">train steps</div>
    <div class="v" id="stat-steps"></div></div>
</div>
<div class="fig" id="fig-tradeoff"></div>
<div class="fig" id="fig-timeline"></div>
<div class="fig" id="fig-utilization"></div>
<div class="fig" id="fig-reward"></div>
<div class="fig" id="fig-throughput"></div>
<div class="fig" id="fig-staleness"></div>
<ul id="notes"></ul>
<p class="sub">Busy: the share of time a component's processes spent inside a span that is
not a wait (mean over replicas), from <code>trace.json</code>; open that file in
<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> or chrome://tracing for every span.
Steady state: from the end of the trainer's first step to the end of its last.
Batch cycle C: from the end of the step that makes version v to the start of the step that
trains on episodes sampled on v's weights (at max_policy_age a, the step that makes
v + a + 1); T: that step. The mean step period is (C + T) / (a + 1): sync pays the whole
cycle each step, async at bound 1 half of it
(<code>benchmarks/async_vs_sync.py</code> splits C into its parts).</p>
<script>%PLOTLYJS%</script>
<script id="report-data" type="application/json">%DATA%</script>
<script>
"use strict";
const REPORT = JSON.parse(document.getElementById("report-data").textContent);
const FIGS = ["tradeoff", "timeline", "utilization", "reward", "throughput", "staleness"];
const CONFIG = {displaylogo: false, responsive: true};

function show(k) {
  const run = REPORT.runs[k];
  document.body.dataset.ready = "";
  document.getElementById("run-label").textContent = run.label;
  document.getElementById("run-dir").textContent = run.dir;
  for (const [key, s] of Object.entries(run.stats)) {
    const el = document.getElementById("stat-" + key);
    if (el) { el.textContent = s.text; el.dataset.value = s.value === null ? "" : s.value; }
  }
  const banner = document.getElementById("banner");
  banner.textContent = run.cut_short
    ? "This run was cut short: the report shows what it recorded. " + run.notes.join("; ")
    : "";
  banner.classList.toggle("hidden", !run.cut_short);
  const notes = document.getElementById("notes");
  notes.replaceChildren(...run.notes.map(n => {
    const li = document.createElement("li"); li.textContent = n; return li;
  }));
  const drawn = [];
  for (const name of FIGS) {
    const div = document.getElementById("fig-" + name);
    const fig = run.figs[name];
    div.classList.toggle("hidden", !fig);
    if (fig) { drawn.push(Plotly.react(div, fig.data, fig.layout, CONFIG)); }
    else { Plotly.purge(div); }
  }
  Promise.all(drawn).then(() => {
    document.body.dataset.selected = String(k);
    document.body.dataset.ready = "1";
  });
}

const slider = document.getElementById("run-slider");
if (REPORT.runs.length > 1) {
  slider.max = String(REPORT.runs.length - 1);
  document.getElementById("slider-box").classList.remove("hidden");
  document.getElementById("ticks").replaceChildren(...REPORT.runs.map(r => {
    const s = document.createElement("span"); s.textContent = r.label; return s;
  }));
}
slider.addEventListener("input", () => show(Number(slider.value)));
show(0);
</script>
</body>
</html>
"""
