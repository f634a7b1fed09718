// mpo_viz per-token credit strip: the one renderer of tokens in the project.
//
// Input: one JSON payload (built by mpo_viz.render.strip.strip_payload, schema "mpo_viz.strip/v1"):
//   { version: 1, title, tokens: [str], mask: [0|1], turn_ids: [int],
//     channels: { name: [number|null] }, channel_info: { name: { label, center, scale, log? } },
//     channel: initial channel name, meta: { key: value }, truth?: { channel, se: [number|null] } }
// Tokens are text coloured by the chosen channel on a diverging scale centred at the channel's
// centre (0 unless said otherwise; a channel whose info says log holds natural logs, coloured as
// they are and shown as exp in the legend and the hover); observation tokens are greyed; every
// turn starts a new row with a turn label; hovering a token shows every channel. Only the visible
// rows are in the DOM, so a 50,000-token trajectory scrolls smoothly.
//
// Two entry points:
//   mount(el, payload, options) -> { update(payload), patch(p), setChannel(name), scrollToToken(i), destroy() }
//   render({ model, el })       -> cleanup   (anywidget: reads the "payload", "arrays", "patch", "patch_arrays"
//                                              and "channel" traits)
// A payload with "truth" (the token truth: its channel holds the true advantage on the measured tokens)
// gets a marker row: every line of tokens is TRUTH_ROW_H tall and each measured token has a bar under
// it, coloured by the true advantage on the scale of the credit shown (markScale); the hover adds
// the true advantage ± 1.96 standard errors.
// patch(p) replaces channels of the payload shown, p = { channels: { name: [number|null] or a
// Float64Array }, channel_info: { name: info }, focus?: int } (or its JSON): the tokens keep their
// layout and scroll position, only the colours, the legend and the hover change (a slider move
// sends only what it changed). The widget sends the patch's values as binary buffers: its JSON has
// null per channel and the "patch_arrays" trait the float64 buffers.
// The report inlines this file as a classic script: everything after the EXPORTS marker is cut and
// `mount`/`render` are put on window.mpoStrip.

const ROW_H = 20; // px, fixed so that row i sits at i * rowH (virtualized scrolling)
const TRUTH_ROW_H = 26; // px, the rows of a payload with a token truth: a marker row under the tokens
const OVERSCAN = 12; // rows rendered above and below the viewport
const GUTTER = 44; // px, the turn-label column
const NEG = [178, 24, 43]; // diverging scale (RdBu): negative
const MID = [247, 247, 247]; // centre
const POS = [33, 102, 172]; // positive
const CONTROL = /[\r\n\t]/; // characters displayText replaces
const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// Text of a token as displayed: control characters made visible, never empty.
function displayText(s) {
  if (s === null || s === undefined) return "\u00b7";
  s = String(s);
  if (s.length === 0) return "\u2205";
  if (!CONTROL.test(s)) return s;
  return s.replace(/\r?\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/\r/g, "\u240d");
}

// Text of token i of normalized payload d: a token that only starts a character completed by a later
// token (it has a note and no text of its own) shows as a midline ellipsis, not as an empty token.
function tokenText(d, i) {
  const t = d.tokens[i];
  if (t === "" && d.notes[i] !== undefined) return "\u22ef";
  return displayText(t);
}

function fmt(v) {
  // a missing value: null in JSON, NaN in a typed array (the widget's binary channels)
  if (v === null || v === undefined || (typeof v === "number" && Number.isNaN(v))) return "\u2014";
  if (typeof v === "number" && !Number.isFinite(v)) return String(v);
  if (typeof v !== "number") return esc(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return (Math.round(v * 1e4) / 1e4).toString();
}

// A channel's value as the reader sees it: exp(v) for a log channel (e.g. a ratio coloured by its log).
function shown(inf, v) {
  return inf && inf.log && typeof v === "number" && Number.isFinite(v) ? Math.exp(v) : v;
}

function mix(a, b, t) {
  return [0, 1, 2].map((j) => Math.round(a[j] + (b[j] - a[j]) * t));
}

// Colour for (v - centre) / scale in [-1, 1]; returns [css background, dark text?].
function colour(x) {
  const t = Math.max(-1, Math.min(1, x));
  const c = t < 0 ? mix(MID, NEG, -t) : mix(MID, POS, t);
  return [`rgb(${c[0]},${c[1]},${c[2]})`, Math.abs(t) < 0.6];
}

function normalize(payload) {
  if (payload === null || payload === undefined) payload = {};
  if (typeof payload === "string") payload = payload ? JSON.parse(payload) : {};
  const tokens = payload.tokens || [];
  const n = tokens.length;
  const mask = payload.mask || new Array(n).fill(1);
  const turn = payload.turn_ids || new Array(n).fill(0);
  const channels = payload.channels || {};
  const info = payload.channel_info || {};
  const names = Object.keys(channels);
  for (const k of names) {
    if (channels[k].length !== n) throw new Error(`mpo strip: channel ${k} has ${channels[k].length} values for ${n} tokens`);
  }
  if (mask.length !== n || turn.length !== n) throw new Error(`mpo strip: mask/turn_ids length differs from tokens (${n})`);
  const focus = Number.isInteger(payload.focus) && payload.focus >= 0 && payload.focus < n ? payload.focus : -1;
  // notes: {index: text} shown in the hover (a character split across tokens lists its raw pieces)
  const notes = payload.notes || {};
  // truth: the token truth's channel (the true advantage on the measured tokens) and its standard errors
  let truth = null;
  if (payload.truth && channels[payload.truth.channel]) {
    const se = payload.truth.se || new Array(n).fill(null);
    if (se.length !== n) throw new Error(`mpo strip: truth.se has ${se.length} values for ${n} tokens`);
    truth = { channel: payload.truth.channel, se };
  }
  return { tokens, mask, turn, channels, info, names, n, title: payload.title || "", meta: payload.meta || {}, channel: payload.channel,
           spaced: !!payload.spaced, focus, notes, truth };
}

export function mount(el, payload, options = {}) {
  let d = normalize(payload);
  let channel = options.channel && d.channels[options.channel] ? options.channel : (d.channel && d.channels[d.channel] ? d.channel : d.names[0]);
  const height = options.height || 360;
  const scales = new Map(); // channel -> [centre, scale]
  const widthCache = new Map(); // display text -> measured width (without span padding); kept across payloads
  let cachedFont = "";
  let asciiAdvance = 0; // width of one printable ASCII character when the token font is monospaced, else 0
  let rowStart = new Int32Array(1); // row r holds tokens rowStart[r] .. rowStart[r+1]-1
  let rowKind = new Uint8Array(0); // 1 = first action row of a turn, 2 = observation row, 0 = continuation
  let nRows = 0;
  let lastRange = [-1, -1];
  let layoutWidth = 0;
  let raf = 0;
  let hovered = -1;
  let rowH = d.truth ? TRUTH_ROW_H : ROW_H;

  el.innerHTML = "";
  const root = document.createElement("div");
  root.className = "mpo-strip";
  root.innerHTML = `
    <div class="mpo-strip-head">
      <span class="mpo-strip-title"></span>
      <label class="mpo-strip-ctl">colour by <select class="mpo-strip-channel" aria-label="channel"></select></label>
      <label class="mpo-strip-ctl">turn <select class="mpo-strip-turn" aria-label="jump to turn"></select></label>
      <span class="mpo-strip-legend"><span class="mpo-strip-lo"></span><span class="mpo-strip-bar"></span><span class="mpo-strip-hi"></span><span class="mpo-strip-scale"></span><span class="mpo-strip-clipinfo"></span><span class="mpo-strip-truthnote" hidden></span></span>
    </div>
    <div class="mpo-strip-viewport" tabindex="0"><div class="mpo-strip-spacer"></div><div class="mpo-strip-layer"></div></div>
    <div class="mpo-strip-tip" role="tooltip" hidden></div>`;
  el.appendChild(root);
  const $ = (s) => root.querySelector(s);
  const title = $(".mpo-strip-title");
  const select = $(".mpo-strip-channel");
  const turnSelect = $(".mpo-strip-turn");
  const viewport = $(".mpo-strip-viewport");
  const spacer = $(".mpo-strip-spacer");
  const layer = $(".mpo-strip-layer");
  const tip = $(".mpo-strip-tip");
  const lo = $(".mpo-strip-lo");
  const hi = $(".mpo-strip-hi");
  const bar = $(".mpo-strip-bar");
  const scaleNote = $(".mpo-strip-scale");
  const clipInfo = $(".mpo-strip-clipinfo");
  const truthNote = $(".mpo-strip-truthnote");
  // The viewport fits its content up to `height` px; the mouse wheel scrolls the page, not the
  // strip, until the strip is clicked (a notebook full of strips must still scroll).
  function fitHeight() {
    viewport.style.height = `${Math.max(rowH * 2, Math.min(height, nRows * rowH + 4))}px`;
    const more = nRows * rowH + 4 > height;
    viewport.classList.toggle("mpo-strip-more", more);
    viewport.title = more ? "click the strip, then the mouse wheel scrolls it (or jump with the turn menu)" : "";
  }
  const onDown = () => root.classList.add("mpo-strip-engaged");
  const onOut = (ev) => { if (!root.contains(ev.relatedTarget)) root.classList.remove("mpo-strip-engaged"); };
  bar.style.background = `linear-gradient(to right, rgb(${NEG}), rgb(${MID}), rgb(${POS}))`;

  // --- measuring and layout -------------------------------------------------------------------
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d");
  function setFont() {
    const probe = document.createElement("span");
    probe.className = "mpo-strip-tok";
    probe.textContent = "x";
    layer.appendChild(probe);
    const cs = getComputedStyle(probe);
    // detached from the document (e.g. a widget view not yet attached) there is no computed font:
    // measure with a stand-in and measure again once attached (see renderVisible)
    const font = cs.fontFamily ? `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}` : "12px monospace";
    if (font !== cachedFont) {
      widthCache.clear();
      ctx.font = font;
      cachedFont = font;
      // a monospaced font: every printable ASCII character has one advance, so an ASCII token's
      // width is its length times it (no canvas call per distinct token)
      const one = ctx.measureText("W").width;
      const mono = [" ", "i", "M", "1", "~"].every((c) => Math.abs(ctx.measureText(c.repeat(10)).width - 10 * one) < 1e-3);
      asciiAdvance = mono ? one : 0;
    }
    // horizontal padding + border + margin of one token span
    const extra = ["paddingLeft", "paddingRight", "marginRight", "marginLeft", "borderLeftWidth", "borderRightWidth"]
      .reduce((s, k) => s + (parseFloat(cs[k]) || 0), 0);
    layer.removeChild(probe);
    return extra;
  }
  root.classList.toggle("mpo-strip-spaced", d.spaced);
  root.classList.toggle("mpo-strip-truthrows", !!d.truth);
  let spanExtra = setFont();
  function width(s) {
    let w = widthCache.get(s);
    if (w === undefined) {
      w = asciiAdvance && PRINTABLE_ASCII.test(s) ? s.length * asciiAdvance : ctx.measureText(s).width;
      widthCache.set(s, w);
    }
    return w + spanExtra;
  }

  function layout() {
    const avail = Math.max(120, (viewport.clientWidth || options.width || 800) - GUTTER - 24);
    layoutWidth = viewport.clientWidth;
    const starts = [0];
    const kinds = [];
    const { n, mask, turn, tokens } = d;
    let x = 0;
    let prevKind = -1; // 1 action, 0 observation
    let prevTurn = -1;
    let forceBreak = false;
    for (let i = 0; i < n; i++) {
      const act = mask[i] ? 1 : 0;
      const newTurn = act && turn[i] !== prevTurn;
      const seg = act !== prevKind || newTurn;
      const raw = tokens[i] === null || tokens[i] === undefined ? "" : String(tokens[i]);
      const w = width(tokenText(d, i));
      if (i > 0 && (seg || forceBreak || x + w > avail)) {
        starts.push(i);
        x = 0;
      }
      if (i === 0 || starts[starts.length - 1] === i) kinds.push(act ? (newTurn ? 1 : 0) : seg ? 2 : 3);
      x += w;
      forceBreak = raw.indexOf("\n") >= 0;
      if (act) prevTurn = turn[i];
      prevKind = act;
    }
    if (n === 0) kinds.length = 0;
    nRows = n === 0 ? 0 : starts.length;
    starts.push(n);
    rowStart = Int32Array.from(starts);
    rowKind = Uint8Array.from(kinds);
    spacer.style.height = `${nRows * rowH}px`;
    lastRange = [-1, -1];
  }

  // --- colours ---------------------------------------------------------------------------------
  function scaleOf(name) {
    if (scales.has(name)) return scales.get(name);
    const inf = d.info[name] || {};
    const centre = Number.isFinite(inf.center) ? inf.center : 0;
    let s = Number.isFinite(inf.scale) && inf.scale > 0 ? inf.scale : 0;
    if (!s) {
      const vals = d.channels[name];
      const dev = [];
      for (let i = 0; i < d.n; i++) {
        const v = vals[i];
        if (d.mask[i] && v !== null && Number.isFinite(v)) dev.push(Math.abs(v - centre));
      }
      if (dev.length) {
        dev.sort((a, b) => a - b);
        s = dev[Math.min(dev.length - 1, Math.floor(0.99 * (dev.length - 1)))] || dev[dev.length - 1];
      }
      if (!(s > 0)) s = 1;
    }
    // tokens beyond the scale are clipped to the end colours: count them and keep the extreme
    const vals = d.channels[name];
    let clipped = 0;
    let worst = 0;
    for (let i = 0; i < d.n; i++) {
      const v = vals[i];
      if (!d.mask[i] || v === null || !Number.isFinite(v)) continue;
      const a = Math.abs(v - centre);
      if (a > s * (1 + 1e-9)) clipped++;
      if (a > worst) worst = a;
    }
    const r = [centre, s, clipped, worst];
    scales.set(name, r);
    return r;
  }

  function legend() {
    if (!channel) {
      lo.textContent = hi.textContent = "";
      return;
    }
    const [c, s, clipped, worst] = scaleOf(channel);
    const inf = d.info[channel] || {};
    lo.textContent = fmt(shown(inf, c - s));
    hi.textContent = fmt(shown(inf, c + s));
    scaleNote.textContent = inf.scale_note ? `(${inf.scale_note})` : "";
    clipInfo.textContent = clipped ? `\u25b2 ${clipped} clipped, largest |v${c ? " \u2212 " + fmt(c) : ""}| ${fmt(worst)}` : "";
    clipInfo.hidden = !clipped;
    bar.title = `${inf.label || channel}: centre ${fmt(c)}, colours saturate at \u00b1${fmt(s)}` +
      (inf.scale_note ? ` (${inf.scale_note})` : "") + (clipped ? `; ${clipped} tokens beyond it are clipped (marked \u25b2)` : "");
    truthNote.hidden = !d.truth;
    if (d.truth) {
      const [mc, ms] = markScale();
      let k = 0;
      for (let i = 0; i < d.n; i++) if (isMeasured(i)) k++;
      truthNote.textContent = `\u2581 true advantage under ${k} measured tokens`;
      truthNote.title = `the bar under a measured token is coloured by its true advantage (Monte-Carlo), ` +
        `on the scale of ${(d.info[markChannel()] || {}).label || markChannel()} (centre ${fmt(mc)}, \u00b1${fmt(ms)}): ` +
        "where a token's colour and its bar differ, the credit shown is not where the truth is";
    }
  }

  // --- the token truth's marks ------------------------------------------------------------------
  function isMeasured(i) {
    if (!d.truth) return false;
    const v = d.channels[d.truth.channel][i];
    return d.mask[i] && v !== null && v !== undefined && Number.isFinite(v);
  }

  // the channel whose scale colours the marks: the channel shown when it is credit, else the truth's own
  function markChannel() {
    if (channel && (channel.startsWith("adv_") || channel === "advantages" || channel === d.truth.channel)) return channel;
    return d.truth.channel;
  }

  function markScale() {
    return scaleOf(markChannel());
  }

  function markHtml(i) {
    if (!isMeasured(i)) return "";
    const [c, s] = markScale();
    return `<span class="mpo-strip-mark" style="background:${colour((d.channels[d.truth.channel][i] - c) / s)[0]}"></span>`;
  }

  // --- rendering --------------------------------------------------------------------------------
  function rowHtml(r) {
    const a = rowStart[r];
    const b = rowStart[r + 1];
    const kind = rowKind[r];
    const vals = channel ? d.channels[channel] : null;
    const [c, s] = channel ? scaleOf(channel) : [0, 1, 0, 0];
    let label = "";
    let cls = "mpo-strip-row";
    if (kind === 1) {
      label = `T${d.turn[a]}`;
      cls += " mpo-strip-turnstart";
    } else if (kind === 2 || kind === 3) {
      if (kind === 2) label = "obs";
      cls += " mpo-strip-obsrow";
    }
    let h = `<div class="${cls}" style="top:${r * rowH}px"><span class="mpo-strip-gutter">${label}</span>`;
    for (let i = a; i < b; i++) {
      const [tc, bg] = tokenStyle(i, vals, c, s);
      h += `<span class="${tc}" data-i="${i}"${bg ? ` style="background:${bg}"` : ""}>${esc(tokenText(d, i))}${markHtml(i)}</span>`;
    }
    return h + "</div>";
  }

  // [class, background or ""] of token i coloured by `vals` on the scale (c, s)
  function tokenStyle(i, vals, c, s) {
    if (!d.mask[i]) return ["mpo-strip-tok mpo-strip-obs", ""];
    const [tc, bg] = tokenColour(i, vals, c, s);
    return [isMeasured(i) ? `${tc} mpo-strip-measured` : tc, bg];
  }

  function tokenColour(i, vals, c, s) {
    const v = vals ? vals[i] : null;
    if (v === null || v === undefined || !Number.isFinite(v)) return ["mpo-strip-tok mpo-strip-na", ""];
    const x = (v - c) / s;
    const [bg, dark] = colour(x);
    const clip = Math.abs(x) > 1 + 1e-9 ? " mpo-strip-clip" : "";
    return [`mpo-strip-tok${dark ? "" : " mpo-strip-light"}${clip}`, bg];
  }

  // new colours for the token spans in the DOM (the same tokens, rows and positions: a patch)
  function recolour() {
    const vals = channel ? d.channels[channel] : null;
    const [c, s] = channel ? scaleOf(channel) : [0, 1, 0, 0];
    for (const t of layer.querySelectorAll("[data-i]")) {
      const i = +t.dataset.i;
      const [tc, bg] = tokenStyle(i, vals, c, s);
      t.className = i === hovered ? `${tc} mpo-strip-hover` : tc;
      t.style.background = bg;
    }
    if (d.truth) {
      const [mc, ms] = markScale();
      for (const m of layer.querySelectorAll(".mpo-strip-mark")) {
        const i = +m.parentNode.dataset.i;
        m.style.background = colour((d.channels[d.truth.channel][i] - mc) / ms)[0];
      }
    }
  }

  function renderVisible(force) {
    raf = 0;
    if (Math.abs(viewport.clientWidth - layoutWidth) > 1 && viewport.clientWidth > 0) {
      const first = rowStart[Math.min(nRows, Math.floor(viewport.scrollTop / rowH))] || 0;
      spanExtra = setFont();
      layout();
      scrollToToken(first, false);
      force = true;
    }
    const top = viewport.scrollTop;
    const h = viewport.clientHeight || height;
    const r0 = Math.max(0, Math.floor(top / rowH) - OVERSCAN);
    const r1 = Math.min(nRows, Math.ceil((top + h) / rowH) + OVERSCAN);
    if (!force && r0 === lastRange[0] && r1 === lastRange[1]) return;
    lastRange = [r0, r1];
    let html = "";
    for (let r = r0; r < r1; r++) html += rowHtml(r);
    layer.innerHTML = html;
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(() => renderVisible(false));
  }

  function rowOfToken(i) {
    let lo_ = 0;
    let hi_ = nRows - 1;
    while (lo_ < hi_) {
      const mid = (lo_ + hi_ + 1) >> 1;
      if (rowStart[mid] <= i) lo_ = mid;
      else hi_ = mid - 1;
    }
    return lo_;
  }

  function scrollToToken(i, render = true) {
    if (!nRows) return;
    viewport.scrollTop = rowOfToken(Math.max(0, Math.min(d.n - 1, i))) * rowH;
    if (render) renderVisible(true);
  }

  // --- controls ----------------------------------------------------------------------------------
  function fillControls() {
    const bits = [];
    if (d.title) bits.push(`<b>${esc(d.title)}</b>`);
    let nAct = 0;
    let K = 0;
    for (let i = 0; i < d.n; i++) if (d.mask[i]) { nAct++; K = Math.max(K, d.turn[i] + 1); }
    bits.push(`${d.n.toLocaleString()} tokens \u00b7 ${nAct.toLocaleString()} action \u00b7 ${K} turns`);
    for (const [k, v] of Object.entries(d.meta)) bits.push(`${esc(k)} ${fmt(v)}`);
    title.innerHTML = bits.join(" \u00b7 ");
    select.innerHTML = d.names.map((k) => `<option value="${esc(k)}">${esc((d.info[k] || {}).label || k)}</option>`).join("");
    if (channel) select.value = channel;
    select.disabled = d.names.length === 0;
    const firsts = [];
    let prev = -1;
    for (let i = 0; i < d.n; i++) if (d.mask[i] && d.turn[i] !== prev) { firsts.push([d.turn[i], i]); prev = d.turn[i]; }
    turnSelect.innerHTML = firsts.slice(0, 5000).map(([k, i]) => `<option value="${i}">T${k} @${i}</option>`).join("");
    turnSelect.disabled = firsts.length === 0;
  }

  function setChannel(name, notify = false) {
    if (!d.channels[name] || name === channel) return;
    channel = name;
    select.value = name;
    legend();
    renderVisible(true);
    if (hovered >= 0) showTip(hovered);
    if (notify && options.onChannel) options.onChannel(name);
  }

  // --- hover ---------------------------------------------------------------------------------------
  function showTip(i) {
    const rows = d.names.map((k) => {
      const inf = d.info[k] || {};
      const v = shown(inf, d.channels[k][i]);
      const label = esc(inf.label || k);
      return `<tr class="${k === channel ? "mpo-strip-active" : ""}"><td>${label}</td><td>${fmt(v)}</td></tr>`;
    });
    tip.innerHTML =
      `<div class="mpo-strip-tiphead">#${i} \u00b7 turn ${d.turn[i]} \u00b7 ${d.mask[i] ? "action" : "observation"}</div>` +
      `<div class="mpo-strip-tiptext">${esc(JSON.stringify(d.tokens[i] === undefined ? null : d.tokens[i]))}</div>` +
      (d.notes[i] !== undefined ? `<div class="mpo-strip-tipnote">${esc(d.notes[i])}</div>` : "") +
      truthTip(i) +
      `<table>${rows.join("")}</table>`;
    tip.hidden = false;
  }

  // the hover's line on the token truth: the true advantage with its 95% interval, or that it was not measured
  function truthTip(i) {
    if (!d.truth || !d.mask[i]) return "";
    if (!isMeasured(i)) return `<div class="mpo-strip-tiptruth">true advantage: not measured</div>`;
    const se = d.truth.se[i];
    const pm = se !== null && se !== undefined && Number.isFinite(se) ? ` \u00b1 ${fmt(1.96 * se)} (1.96\u00b7se)` : "";
    return `<div class="mpo-strip-tiptruth">true advantage \u00c2<sub>t</sub> = ${fmt(d.channels[d.truth.channel][i])}${pm}</div>`;
  }

  function onOver(ev) {
    const t = ev.target.closest ? ev.target.closest("[data-i]") : null;
    if (!t) return;
    const i = +t.dataset.i;
    if (i !== hovered) {
      const old = layer.querySelector(".mpo-strip-hover");
      if (old) old.classList.remove("mpo-strip-hover");
      t.classList.add("mpo-strip-hover");
      hovered = i;
      showTip(i);
    }
    const rb = root.getBoundingClientRect();
    const tb = t.getBoundingClientRect();
    let left = tb.left - rb.left;
    const tw = tip.offsetWidth || 240;
    if (left + tw > rb.width) left = Math.max(0, rb.width - tw);
    let top = tb.bottom - rb.top + 4;
    if (top + tip.offsetHeight > rb.height && tb.top - rb.top - tip.offsetHeight - 4 >= 0) top = tb.top - rb.top - tip.offsetHeight - 4;
    tip.style.left = `${left}px`;
    tip.style.top = `${top}px`;
  }

  function onLeave() {
    hovered = -1;
    tip.hidden = true;
    const old = layer.querySelector(".mpo-strip-hover");
    if (old) old.classList.remove("mpo-strip-hover");
  }

  const onSelect = () => setChannel(select.value, true);
  const onTurn = () => scrollToToken(+turnSelect.value);
  select.addEventListener("change", onSelect);
  turnSelect.addEventListener("change", onTurn);
  viewport.addEventListener("scroll", schedule, { passive: true });
  layer.addEventListener("mouseover", onOver);
  viewport.addEventListener("mouseleave", onLeave);
  root.addEventListener("mousedown", onDown);
  root.addEventListener("mouseout", onOut);
  let ro = null;
  if (typeof ResizeObserver !== "undefined") {
    ro = new ResizeObserver(() => {
      if (viewport.clientWidth > 0 && Math.abs(viewport.clientWidth - layoutWidth) > 1) schedule();
    });
    ro.observe(viewport);
  }

  function update(p) {
    const prev = d;
    d = normalize(p);
    // A new payload for the same trajectory (e.g. a slider moved) keeps the reader's place.
    const same = prev && prev.title === d.title && prev.n === d.n;
    const keepTop = same ? viewport.scrollTop : 0;
    scales.clear();
    root.classList.toggle("mpo-strip-spaced", d.spaced);
    root.classList.toggle("mpo-strip-truthrows", !!d.truth);
    rowH = d.truth ? TRUTH_ROW_H : ROW_H;
    spanExtra = setFont();
    if (!d.channels[channel]) channel = d.channel && d.channels[d.channel] ? d.channel : d.names[0];
    onLeave();
    fillControls();
    legend();
    layout();
    fitHeight();
    viewport.scrollTop = keepTop;
    // a new trajectory opens where the payload points (e.g. the turn where estimators disagree most)
    if (!same && d.focus >= 0) scrollToToken(d.focus, false);
    renderVisible(true);
  }

  function patch(p) {
    if (typeof p === "string") p = p ? JSON.parse(p) : null;
    if (!p) return;
    const chans = p.channels || {};
    const fresh = Object.keys(chans).filter((k) => !d.channels[k]);
    if (fresh.length) throw new Error(`mpo strip: patch of channels the payload does not have: ${fresh.join(", ")}`);
    for (const [k, v] of Object.entries(chans)) {
      if (v.length !== d.n) throw new Error(`mpo strip: channel ${k} has ${v.length} values for ${d.n} tokens`);
    }
    d = { ...d, channels: { ...d.channels, ...chans }, info: { ...d.info, ...(p.channel_info || {}) } };
    // a new focus is where a view opened later scrolls to; this one keeps the reader's place
    if (Number.isInteger(p.focus) && p.focus >= 0 && p.focus < d.n) d.focus = p.focus;
    scales.clear();
    legend();
    recolour();
    if (hovered >= 0) showTip(hovered);
  }

  fillControls();
  legend();
  layout();
  fitHeight();
  if (d.focus >= 0) scrollToToken(d.focus, false);
  renderVisible(true);

  return {
    update,
    patch,
    setChannel: (name) => setChannel(name, false),
    scrollToToken,
    get channel() {
      return channel;
    },
    get rows() {
      return nRows;
    },
    get scale() {
      return channel ? scaleOf(channel).slice() : null;
    },
    destroy() {
      if (raf) cancelAnimationFrame(raf);
      if (ro) ro.disconnect();
      select.removeEventListener("change", onSelect);
      turnSelect.removeEventListener("change", onTurn);
      viewport.removeEventListener("scroll", schedule);
      layer.removeEventListener("mouseover", onOver);
      viewport.removeEventListener("mouseleave", onLeave);
      root.removeEventListener("mousedown", onDown);
      root.removeEventListener("mouseout", onOut);
      el.innerHTML = "";
    },
  };
}

// The numbers of a widget payload sent as binary buffers (the "arrays" trait: DataViews), as
// typed arrays; a view's offset may not be a multiple of the element size, then it is copied.
function typed(dv, Type) {
  if (!dv) return null;
  if (ArrayBuffer.isView(dv) && !(dv instanceof DataView)) return dv;
  const buf = dv.buffer || dv;
  const off = dv.byteOffset || 0;
  const len = dv.byteLength;
  return off % Type.BYTES_PER_ELEMENT === 0
    ? new Type(buf, off, len / Type.BYTES_PER_ELEMENT)
    : new Type(buf.slice(off, off + len));
}

// The "patch" trait (JSON; null per channel whose values are in the "patch_arrays" buffers) as an
// object whose channels are arrays; null for no patch.
function withPatchArrays(patch, arrays) {
  const p = typeof patch === "string" ? (patch ? JSON.parse(patch) : null) : patch;
  if (!p) return null;
  const chans = {};
  for (const [k, v] of Object.entries(p.channels || {})) {
    if (v !== null) chans[k] = v;
    else if (arrays && arrays[k]) chans[k] = typed(arrays[k], Float64Array);
    else throw new Error(`mpo strip: the patch's channel ${k} has no values (patch_arrays has no buffer for it)`);
  }
  return { ...p, channels: chans };
}

// payload (an object, numbers as arrays) with a patch's channels, channel info and focus (what
// patch() does to a view on screen; a view opened later starts from it and lays out once)
function patched(payload, p) {
  if (!p) return payload;
  const out = { ...payload, channels: { ...(payload.channels || {}), ...(p.channels || {}) },
                channel_info: { ...(payload.channel_info || {}), ...(p.channel_info || {}) } };
  if (p.focus !== undefined) out.focus = p.focus;
  return out;
}

function withArrays(payload, arrays) {
  if (!arrays || !arrays.mask) return payload;
  const p = typeof payload === "string" ? (payload ? JSON.parse(payload) : {}) : { ...payload };
  p.mask = typed(arrays.mask, Uint8Array);
  p.turn_ids = typed(arrays.turn_ids, Int32Array);
  const chans = {};
  for (const k of Object.keys(p.channels || {})) chans[k] = typed((arrays.channels || {})[k], Float64Array);
  p.channels = chans;
  return p;
}

// anywidget entry point, reached through the module's default object only (anywidget treats a
// top-level named render as its deprecated form and warns once per model): the model has a
// "payload" trait (JSON string or object; its numbers optionally in an "arrays" trait of binary
// buffers), optionally a "patch" trait and a "channel" trait kept in sync both ways.
function render({ model, el }) {
  const has = (k) => {
    try {
      return model.get(k) !== undefined;
    } catch (e) {
      return false;
    }
  };
  const read = () => withArrays(model.get("payload"), has("arrays") ? model.get("arrays") : null);
  const readPatch = () => withPatchArrays(has("patch") ? model.get("patch") : "",
                                          has("patch_arrays") ? model.get("patch_arrays") : null);
  const initial = read();
  const view = mount(el, patched(typeof initial === "string" ? (initial ? JSON.parse(initial) : {}) : initial, readPatch()), {
    channel: has("channel") ? model.get("channel") : undefined,
    height: has("height") && model.get("height") ? model.get("height") : undefined,
    onChannel: (name) => {
      if (has("channel")) {
        model.set("channel", name);
        model.save_changes();
      }
    },
  });
  // A new payload comes with the patch reset; a patch holds every channel replaced since its
  // payload. Traits sent together (payload and arrays; patch and patch_arrays) arrive in one
  // message and fire one change event each: one update, once all of them are set.
  let queued = false;
  let patchQueued = false;
  let closed = false;
  const onPayload = () => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => {
      queued = false;
      if (closed) return;
      view.update(read());
      const p = readPatch();
      if (p) view.patch(p);
    });
  };
  const onPatch = () => {
    if (queued || patchQueued) return; // queued: the update applies it
    patchQueued = true;
    queueMicrotask(() => {
      patchQueued = false;
      if (closed || queued) return;
      const p = readPatch();
      if (p) view.patch(p);
    });
  };
  const onChannel = () => {
    const c = model.get("channel");
    if (c) view.setChannel(c);
  };
  model.on("change:payload", onPayload);
  model.on("change:arrays", onPayload);
  model.on("change:patch", onPatch);
  model.on("change:patch_arrays", onPatch);
  model.on("change:channel", onChannel);
  return () => {
    closed = true;
    model.off("change:payload", onPayload);
    model.off("change:arrays", onPayload);
    model.off("change:patch", onPatch);
    model.off("change:patch_arrays", onPatch);
    model.off("change:channel", onChannel);
    view.destroy();
  };
}

// @@EXPORTS@@ (everything below is cut when the report inlines this file as a classic script)
export default { render, mount };
