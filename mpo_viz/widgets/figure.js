// mpo_viz figure widget: plotly's own FigureWidget front end, with three changes.
//
// 1. Imported once per page. anywidget imports a widget's ES module afresh for every model (a new
//    blob URL each time), and plotly's module is ~5 MB: reopening a notebook with a live kernel
//    creates every figure model at once, the imports queue on the main thread, and each model that
//    is not ready within anywidget's 2 s limit logs "[anywidget] Failed to initialize model" and
//    drops the kernel's later messages to it. Here every figure model shares one import of plotly's
//    module. Its source is one model of its own, sent once per kernel (`_plotly_source` refers to
//    it), and read only by the first figure of the page.
// 2. Sized to its output. plotly draws into the view's element before the page attaches it; with no
//    width there it takes its 700 px default. A ResizeObserver redraws the figure at the element's
//    width once it has one (and when the output is resized); the layout's height is kept. Figures
//    given an explicit layout width keep it.
// 3. Its reports to Python after a redraw come once the page is quiet. After every update plotly's
//    view diffs its full layout and full data against the model and sends the differences back to
//    Python (_sendLayoutDelta, _sendTraceDeltas), synchronously, before the browser can paint the
//    redraw: about a fifth of a slider move's redraw (~15 ms). Run after the next frame they still
//    delayed the frames after it and the kernel's other messages of the same move (the strip, the
//    tables, the header). Here they run when no redraw has asked for one for QUIET_MS, in an idle
//    period (at the latest LATEST_MS after being asked), in order, each with its own edit id,
//    reading the state at that time; Python's on_edits_completed callbacks wait for them. A view
//    removed in the meantime (its figure replaced or closed) reports nothing: its model may be
//    closed, and sending through a closed model throws.

const KEY = Symbol.for("mpo_viz.plotly_widget_module");

const REF = "IPY_MODEL_";

// the source of plotly's module: the PlotlySource model the figure's `_plotly_source` refers to
async function plotlySource(model) {
  const ref = model.get("_plotly_source");
  if (typeof ref !== "string" || !ref.startsWith(REF))
    throw new Error(`mpo_viz figure: _plotly_source should be a widget reference (${REF}...), found ${JSON.stringify(ref)}`);
  const src = await model.widget_manager.get_model(ref.slice(REF.length));
  const source = src.get("source");
  if (!source) throw new Error("mpo_viz figure: the PlotlySource model has no source");
  return source;
}

function plotlyModule(model) {
  const g = globalThis;
  if (!g[KEY]) {
    g[KEY] = plotlySource(model).then((source) => {
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      return import(/* webpackIgnore: true */ /* @vite-ignore */ url).finally(() => URL.revokeObjectURL(url));
    });
    g[KEY].catch(() => {
      delete g[KEY]; // a later figure tries again
    });
  }
  return g[KEY];
}

const DEFERRED = Symbol.for("mpo_viz.plotly_deltas_deferred");
const REMOVED = Symbol.for("mpo_viz.plotly_view_removed");
const QUIET_MS = 250; // the deltas wait until no redraw has asked for one for this long
const LATEST_MS = 2000; // and at most this long after the first waiting one was asked for

// Deferred calls, run in the order they were asked for, once the page is quiet: no new call for
// QUIET_MS (a slider move's messages from the kernel come within a few tens of milliseconds, and
// the frames that show the redraw are painted by then), then in an idle period; at the latest
// LATEST_MS after the first waiting call (a page that is never idle still reports).
const queue = [];
let quietTimer = 0;
let latestTimer = 0;
let idleAsked = false;
function flush() {
  clearTimeout(quietTimer);
  clearTimeout(latestTimer);
  quietTimer = latestTimer = 0;
  idleAsked = false;
  const calls = queue.splice(0);
  for (const fn of calls) {
    try {
      fn();
    } catch (e) {
      console.error("mpo_viz figure: a deferred plotly report failed", e);
    }
  }
}
function whenIdle() {
  quietTimer = 0;
  if (idleAsked) return;
  idleAsked = true;
  if (typeof requestIdleCallback === "function") requestIdleCallback(() => queue.length && flush(), { timeout: 250 });
  else setTimeout(() => queue.length && flush(), 0);
}
function later(fn) {
  queue.push(fn);
  clearTimeout(quietTimer);
  quietTimer = setTimeout(whenIdle, QUIET_MS);
  if (!latestTimer) latestTimer = setTimeout(flush, LATEST_MS);
}

function deferDeltas(mod) {
  const View = mod && mod.FigureView;
  if (!View || View.prototype[DEFERRED]) return;
  for (const name of ["_sendLayoutDelta", "_sendTraceDeltas"]) {
    const send = View.prototype[name];
    if (typeof send !== "function") continue;
    View.prototype[name] = function (...args) {
      later(() => {
        if (!this[REMOVED]) send.apply(this, args);
      });
    };
  }
  const remove = View.prototype.remove;
  View.prototype.remove = function (...args) {
    this[REMOVED] = true;
    return typeof remove === "function" ? remove.apply(this, args) : undefined;
  };
  View.prototype[DEFERRED] = true;
}

function fit(gd) {
  const w = gd.clientWidth;
  const full = gd._fullLayout;
  if (!(w > 0) || !full || (gd.layout && gd.layout.width)) return;
  // plotly's own resize handler (config.responsive): relayout with autosize, width from the element
  if (Math.abs(full.width - w) > 2 && typeof gd._responsiveChartHandler === "function") gd._responsiveChartHandler();
}

export default () => {
  let inner = null;
  return {
    async initialize(ctx) {
      const mod = await plotlyModule(ctx.model);
      deferDeltas(mod);
      inner = typeof mod.default === "function" ? mod.default() : mod.default;
      if (!inner || !inner.render) throw new Error("mpo_viz figure: plotly's widget module has no default export with render()");
      return inner.initialize ? inner.initialize(ctx) : undefined;
    },
    render(ctx) {
      const cleanup = inner.render(ctx);
      const gd = ctx.el;
      let ro = null;
      if (typeof ResizeObserver !== "undefined") {
        ro = new ResizeObserver(() => fit(gd));
        ro.observe(gd);
      }
      return () => {
        if (ro) ro.disconnect();
        if (typeof cleanup === "function") cleanup();
      };
    },
  };
};
