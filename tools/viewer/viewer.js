'use strict';
(function () {
  var $ = function (id) { return document.getElementById(id); };
  var status = $('pp-status');
  var D = null;               /* the snapshot */
  var stateColor = { allocated: '#4e79a7', pending_free: '#f28e2b', cached: '#8cd17d' };
  var UNCARVED = '#e4e4e4';
  var UNLISTED = '#8c959f'; /* in a chunk, in no segment and no free range */

  /* ---- Formatting (the same units as the command-line tool) ------------ */
  function fmtBytes(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], u = 0, v = b;
    while (Math.abs(v) >= 1024 && u + 1 < units.length) { v /= 1024; u++; }
    if (u === 0) return v.toFixed(0) + ' B';
    return v.toFixed(Math.abs(v) >= 100 ? 1 : 2) + ' ' + units[u];
  }
  function fmtNs(ns) {
    if (ns < 1e3) return ns.toFixed(0) + ' ns';
    if (ns < 1e6) return (ns / 1e3).toFixed(2) + ' us';
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + ' ms';
    return (ns / 1e9).toFixed(2) + ' s';
  }
  function fmtInt(n) { return Number(n).toLocaleString('en-US'); }
  function hex(n) { return '0x' + Number(n).toString(16); }
  function plural(n, what) { return fmtInt(n) + ' ' + what + (n === 1 ? '' : 's'); }
  function pct(a, b) { return b > 0 ? (100 * a / b).toFixed(1) + ' %' : '-'; }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* Errors in one view should not hide the others. */
  function guarded(name, fn) {
    try { fn(); } catch (e) {
      window.ppError(name + ': ' + (e && e.message || e) +
                     (e && e.stack ? '\n' + String(e.stack).split('\n').slice(1, 3).join('\n') : ''));
    }
  }

  /* ---- Stacks and allocation sites ------------------------------------- */
  /* A site is the innermost frame of the allocation's stack, written as
   * snap_site (tools/snapshot_load.c) writes it for `summary`, so that the
   * page and the tool name sites alike. */
  var siteCache = [];
  function siteLabel(stack) {
    if (stack === null || stack === undefined) return '(no stack)';
    if (siteCache[stack] !== undefined) return siteCache[stack];
    var st = D.stacks[stack], s;
    if (!st || st.length === 0) s = '(empty stack)';
    else {
      var f = D.frames[st[0]];
      if (f.function !== null && f.file !== null)
        s = f.function + ' (' + f.file + (f.line !== null ? ':' + f.line : '') + ')';
      else if (f.function !== null) s = f.function + '+0x' + f.offset.toString(16);
      else if (f.file !== null && f.line !== null) s = hex(f.address) + ' (' + f.file + ':' + f.line + ')';
      else s = hex(f.address);
    }
    siteCache[stack] = s;
    return s;
  }
  function frameText(j, f) {
    var s = '#' + j + ' ' + (f.function !== null ? f.function + '+0x' + f.offset.toString(16)
                                                 : hex(f.address));
    if (f.file !== null) s += '  ' + f.file + (f.line !== null ? ':' + f.line : '');
    if (f.module !== null) s += '  [' + f.module + ']';
    return s;
  }
  function stackText(stack) {
    if (stack === null || stack === undefined) return '(no stack: history was off, or stack_depth 0)';
    var st = D.stacks[stack];
    if (!st || st.length === 0) return '(empty stack)';
    return st.map(function (fi, j) { return frameText(j, D.frames[fi]); }).join('\n');
  }

  /* ---- Tooltip ---------------------------------------------------------- */
  var tip = $('pp-tooltip');
  function showTip(clientX, clientY, title, rows, stack) {
    tip.textContent = '';
    tip.appendChild(el('div', 'tt-title', title));
    var t = el('table');
    rows.forEach(function (r) {
      var tr = el('tr');
      tr.appendChild(el('td', '', r[0]));
      tr.appendChild(el('td', '', r[1]));
      t.appendChild(tr);
    });
    tip.appendChild(t);
    if (stack !== undefined) tip.appendChild(el('div', 'tt-stack', stackText(stack)));
    tip.hidden = false;
    /* Keep it inside the window: flip to the other side of the pointer. */
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var x = clientX + 14, y = clientY + 14;
    if (x + w > window.innerWidth - 4) x = Math.max(4, clientX - w - 14);
    if (y + h > window.innerHeight - 4) y = Math.max(4, clientY - h - 14);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  function hideTip() { tip.hidden = true; }

  /* A canvas sized in CSS pixels and drawn sharp on high-DPI screens. */
  function sizeCanvas(c, w, h) {
    var r = window.devicePixelRatio || 1;
    c.style.width = w + 'px';
    c.style.height = h + 'px';
    c.width = Math.max(1, Math.round(w * r));
    c.height = Math.max(1, Math.round(h * r));
    var ctx = c.getContext('2d');
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return ctx;
  }
  /* Diagonal hatching on a fill, repeated: rounding waste, free gaps. */
  function hatchPattern(ctx, fill, stroke, width) {
    var pc = document.createElement('canvas');
    pc.width = 6; pc.height = 6;
    var pctx = pc.getContext('2d');
    pctx.fillStyle = fill;
    pctx.fillRect(0, 0, 6, 6);
    pctx.strokeStyle = stroke;
    pctx.lineWidth = width;
    pctx.beginPath(); pctx.moveTo(0, 6); pctx.lineTo(6, 0); pctx.moveTo(-3, 3); pctx.lineTo(3, -3);
    pctx.moveTo(3, 9); pctx.lineTo(9, 3); pctx.stroke();
    return ctx.createPattern(pc, 'repeat');
  }
  function contentWidth(sectionId) {
    var s = $(sectionId), cs = getComputedStyle(s);
    return Math.max(300, s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight));
  }

  /* ---- Header and totals ------------------------------------------------ */
  function renderHeader() {
    var when = '';
    if (D.unix_time > 0) when = new Date(D.unix_time * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
    $('meta').textContent = 'pinpool ' + D.pinpool_version + ' \u00b7 pid ' + D.pid +
      ' \u00b7 backend ' + D.backend + ' \u00b7 taken ' + when +
      ' \u00b7 gathered in ' + fmtNs(D.gather_ns) + ' (longest lock hold ' + fmtNs(D.max_hold_ns) +
      ') \u00b7 config ' + D.config;
    document.title = 'pinpool snapshot \u00b7 pid ' + D.pid;

    var T = D.totals, H = D.history;
    var waste = Math.max(0, T.allocated_bytes - T.requested_bytes);
    var cachedBlocksBytes = Math.max(0, T.cached_bytes - T.uncarved_bytes - T.tail_bytes - T.chunk_free_bytes);
    var chunkText = D.chunks ? ' in ' + plural(D.chunks.length, 'chunk') : '';
    var cards = [
      ['Reserved', fmtBytes(T.reserved_bytes), plural(T.segments, 'segment') + chunkText +
        (T.chunk_free_bytes ? ' + ' + fmtBytes(T.chunk_free_bytes) + ' free in chunks' : '')],
      ['Allocated', fmtBytes(T.allocated_bytes), plural(T.allocated_blocks, 'block') + ' \u00b7 requested ' +
        fmtBytes(T.requested_bytes)],
      ['Rounding waste', fmtBytes(waste), T.allocated_bytes > 0 ?
        pct(waste, T.allocated_bytes) + ' of allocated' : 'nothing allocated'],
      ['Pending free', fmtBytes(T.pending_bytes), plural(T.pending_blocks, 'block') + ' awaiting stream events'],
      ['Cached', fmtBytes(T.cached_bytes), plural(T.cached_blocks, 'block') + ' \u00b7 ' +
        fmtBytes(T.uncarved_bytes) + ' uncarved \u00b7 ' + fmtBytes(T.tail_bytes) + ' tails' +
        (T.chunk_free_bytes ? ' \u00b7 ' + fmtBytes(T.chunk_free_bytes) + ' free in chunks' : '')],
      ['History', fmtInt(H.entries.length) + (H.entries.length === 1 ? ' entry' : ' entries'), 'record ' + H.record + ' \u00b7 ' +
        fmtInt(H.dropped) + ' dropped \u00b7 ' + fmtInt(H.recorded) + ' recorded']
    ];
    var box = $('cards');
    box.textContent = '';
    cards.forEach(function (c) {
      var d = el('div', 'card');
      d.appendChild(el('div', 'k', c[0]));
      d.appendChild(el('div', 'v', c[1]));
      d.appendChild(el('div', 's', c[2]));
      box.appendChild(d);
    });

    /* Where the reserved bytes are: one bar, the parts in the map's colors. */
    var parts = [
      ['requested (allocated)', T.requested_bytes, stateColor.allocated, ''],
      ['rounding waste', waste, '', 'hatch'],
      ['pending free', T.pending_bytes, stateColor.pending_free, ''],
      ['cached blocks', cachedBlocksBytes, stateColor.cached, ''],
      ['uncarved and tails', T.uncarved_bytes + T.tail_bytes, UNCARVED, ''],
      ['free in chunks', T.chunk_free_bytes, '', 'freechunk']
    ];
    var bar = $('bar'), lg = $('bar-legend');
    bar.textContent = '';
    lg.textContent = '';
    parts.forEach(function (p) {
      var frac = T.reserved_bytes > 0 ? p[1] / T.reserved_bytes : 0;
      var d = el('div', p[3]);
      d.style.width = (100 * frac) + '%';
      if (p[2]) d.style.background = p[2];
      d.title = p[0] + ': ' + fmtBytes(p[1]) + ' (' + pct(p[1], T.reserved_bytes) + ')';
      bar.appendChild(d);
      var li = el('li'), sw = el('span', 'sw ' + p[3]);
      if (p[2]) sw.style.background = p[2];
      li.appendChild(sw);
      li.appendChild(el('span', 'lbl', p[0] + ' ' + fmtBytes(p[1]) + ' (' + pct(p[1], T.reserved_bytes) + ')'));
      lg.appendChild(li);
    });
  }

  /* ---- Timeline --------------------------------------------------------- */
  var TOP_SITES = 8;
  var palette = ['#4e79a7', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1',
                 '#9c755f', '#ff9da7', '#86bcb6', '#d37295'];
  var TL = null; /* what the hover handler needs */

  /* 1, 2 or 5 times a power of ten, at least x. */
  function nice125(x) {
    var p = Math.pow(10, Math.floor(Math.log10(x))), m = x / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  /* Byte ticks fall on round binary amounts (256 MiB, not 268.4 MB). */
  function niceBytes(x) {
    if (x <= 1) return 1;
    var u = Math.pow(1024, Math.floor(Math.log(x) / Math.log(1024))), m = x / u;
    var steps = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 512, 1024];
    for (var i = 0; i < steps.length; i++) if (steps[i] >= m) return steps[i] * u;
    return 1024 * u;
  }

  /* Replays the history into per-site live bytes.
   *
   * The ring keeps only the newest entries, so some blocks were allocated
   * before the first kept entry: a block whose first kept event is a free
   * was live from the start, and a block live in the snapshot with no kept
   * event was live all along. Both are counted from the start (the latter
   * under its own site), so the right end of the chart meets the snapshot's
   * totals. */
  function replay() {
    var E = D.history.entries, n = E.length;
    var first = new Map();
    for (var i = 0; i < n; i++) {
      var a = E[i][2];
      if ((a === 'alloc' || a === 'free_requested' || a === 'free_completed') && !first.has(E[i][3]))
        first.set(E[i][3], E[i]);
    }
    var sites = [], siteIdx = new Map();
    function site(label) {
      var k = siteIdx.get(label);
      if (k === undefined) { k = sites.length; siteIdx.set(label, k); sites.push({ label: label, cur: 0, peak: 0 }); }
      return k;
    }
    var live = new Map(), pre = 0;
    first.forEach(function (e, addr) {
      if (e[2] !== 'alloc') { live.set(addr, { s: site('(allocated before the history)'), size: e[4], p: false }); pre++; }
    });
    D.segments.forEach(function (seg) {
      seg.blocks.forEach(function (b) {
        if (b.state === 'cached' || first.has(b.address)) return;
        live.set(b.address, { s: site(siteLabel(b.stack)), size: seg.block_size, p: b.state === 'pending_free' });
        pre++;
      });
    });
    var initPending = 0;
    live.forEach(function (v) { if (v.p) initPending += v.size; else sites[v.s].cur += v.size; });
    var init = sites.map(function (s) { return s.cur; });
    sites.forEach(function (s) { s.peak = s.cur; });
    var pending = initPending, pendingPeak = pending;

    /* Reserved bytes, walked back from the snapshot's. segment_alloc and
     * segment_free entries are backend allocations: since the arena (the
     * snapshots with `chunks`) those are chunks, whose bytes are all of
     * reserved_bytes; before, they were the segments. */
    var reserved = D.chunks ? D.totals.reserved_bytes : D.totals.segment_bytes;
    for (i = n - 1; i >= 0; i--) {
      if (E[i][2] === 'segment_alloc') reserved -= E[i][4];
      else if (E[i][2] === 'segment_free') reserved += E[i][4];
    }
    var initReserved = Math.max(0, reserved);

    /* Changes: (entry index, series: site, -1 pending, -2 reserved; delta). */
    var chE = [], chS = [], chD = [], ooms = [];
    function ch(i, s, d) {
      chE.push(i); chS.push(s); chD.push(d);
      if (s >= 0) { var x = sites[s]; x.cur += d; if (x.cur > x.peak) x.peak = x.cur; }
      else if (s === -1) { pending += d; if (pending > pendingPeak) pendingPeak = pending; }
    }
    for (i = 0; i < n; i++) {
      var e = E[i], act = e[2], addr = e[3], v = live.get(addr);
      if (act === 'alloc') {
        if (v) ch(i, v.p ? -1 : v.s, -v.size); /* its free was dropped */
        v = { s: site(siteLabel(e[8])), size: e[4], p: false };
        live.set(addr, v);
        ch(i, v.s, v.size);
      } else if (act === 'free_requested') {
        if (v && !v.p) { ch(i, v.s, -v.size); ch(i, -1, v.size); v.p = true; }
      } else if (act === 'free_completed') {
        if (v) { ch(i, v.p ? -1 : v.s, -v.size); live.delete(addr); }
      } else if (act === 'segment_alloc') ch(i, -2, e[4]);
      else if (act === 'segment_free') ch(i, -2, -e[4]);
      else if (act === 'oom') ooms.push(e[1]);
    }
    return { sites: sites, init: init, initPending: initPending, pendingPeak: pendingPeak,
             initReserved: initReserved, chE: chE, chS: chS, chD: chD, ooms: ooms, pre: pre };
  }

  var R = null; /* the replay, kept across resizes */
  function renderTimeline() {
    var H = D.history, E = H.entries, canvas = $('timeline');
    status.setAttribute('data-entries', String(E.length));
    var lg = $('tl-legend');
    lg.textContent = '';
    if (E.length === 0) {
      canvas.hidden = true;
      $('tl-note').textContent = H.record === 'none'
        ? 'History was off when this snapshot was taken (record: none), so there is no timeline. ' +
          'Switch history on (record=alloc or all) to see live memory over time.'
        : 'The history holds no entries (record: ' + H.record + ').';
      return;
    }
    if (R === null) R = replay();

    /* Series: the largest sites by peak, the rest as "other", then pending. */
    var order = R.sites.map(function (s, k) { return k; })
      .filter(function (k) { return R.sites[k].peak > 0; })
      .sort(function (a, b) { return R.sites[b].peak - R.sites[a].peak; });
    var series = [], seriesOf = new Int32Array(R.sites.length).fill(-1);
    var maxPeak = order.length ? R.sites[order[0]].peak : 0;
    var minor = [];
    order.forEach(function (k) {
      if (series.length < TOP_SITES && R.sites[k].peak >= maxPeak / 200) {
        seriesOf[k] = series.length;
        series.push({ label: R.sites[k].label, color: palette[series.length % palette.length], peak: R.sites[k].peak });
      } else minor.push(k);
    });
    var other = -1, pend = -1;
    if (minor.length) {
      other = series.length;
      series.push({ label: 'other (' + minor.length + ' sites)', color: '#bab0ac', peak: 0 });
    }
    /* Sites that never held a byte have only zero deltas; any series does. */
    for (var k = 0; k < R.sites.length; k++) if (seriesOf[k] < 0) seriesOf[k] = other >= 0 ? other : 0;
    if (R.pendingPeak > 0) {
      pend = series.length;
      series.push({ label: 'pending free (all sites)', color: stateColor.pending_free, peak: R.pendingPeak });
    }
    var nS = series.length;

    var w = contentWidth('timeline-section'), h = 300;
    var L = 76, Rm = 12, Tm = 10, B = 34, pw = Math.max(50, Math.floor(w - L - Rm)), ph = h - Tm - B;
    canvas.hidden = false;
    var ctx = sizeCanvas(canvas, w, h);

    var t0 = E[0][1], t1 = Math.max(E[E.length - 1][1], D.time_ns);
    if (t1 <= t0) t1 = t0 + 1;
    var cols = pw, span = t1 - t0;
    function colOf(t) { return Math.min(cols - 1, Math.max(0, Math.floor((t - t0) / span * cols))); }

    /* Per pixel column, the stack at the moment of its largest total, so
     * that short peaks stay visible however many events share a column. */
    var vals = new Float64Array(cols * nS), colMax = new Float64Array(cols).fill(-1);
    var resv = new Float64Array(cols);
    var cur = new Float64Array(nS), total = 0, reserved = R.initReserved;
    for (k = 0; k < R.sites.length; k++) if (R.init[k]) { cur[seriesOf[k]] += R.init[k]; total += R.init[k]; }
    if (pend >= 0) { cur[pend] += R.initPending; total += R.initPending; }
    function commit(c) {
      if (total > colMax[c]) { colMax[c] = total; vals.set(cur, c * nS); }
      if (reserved > resv[c]) resv[c] = reserved;
    }
    commit(0);
    var last = 0, j = 0, nch = R.chE.length;
    while (j < nch) {
      var ei = R.chE[j], c = colOf(E[ei][1]);
      for (var cc = last + 1; cc <= c; cc++) commit(cc);
      if (c > last) last = c;
      for (; j < nch && R.chE[j] === ei; j++) {
        var s = R.chS[j], d = R.chD[j];
        if (s === -2) { reserved += d; continue; }
        var si = s === -1 ? pend : seriesOf[s];
        cur[si] += d; total += d;
      }
      commit(last);
    }
    for (cc = last + 1; cc < cols; cc++) commit(cc);

    var ymax = 1;
    for (c = 0; c < cols; c++) ymax = Math.max(ymax, colMax[c], resv[c]);
    /* Headroom, so that the reserved line does not hide in the frame. */
    var ystep = niceBytes(ymax / 5);
    ymax = Math.ceil(ymax * 1.04 / ystep) * ystep;
    var sy = ph / ymax;

    ctx.clearRect(0, 0, w, h);
    ctx.font = '11px system-ui, "DejaVu Sans", sans-serif';
    ctx.fillStyle = '#656d76';
    ctx.strokeStyle = '#eaeef2';
    ctx.lineWidth = 1;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (var yv = 0; yv <= ymax + ystep / 2; yv += ystep) {
      var yy = Math.round(Tm + ph - yv * sy) + 0.5;
      ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(L + pw, yy); ctx.stroke();
      ctx.fillText(fmtBytes(yv), L - 6, yy);
    }
    /* Time relative to the snapshot, in the largest unit the span fills. */
    var units = [[1e9, 's'], [1e6, 'ms'], [1e3, 'us'], [1, 'ns']], un = units[3];
    for (var ui = 0; ui < units.length; ui++) if (span >= units[ui][0]) { un = units[ui]; break; }
    var tstep = nice125(span / 8), dec = Math.max(0, Math.ceil(-Math.log10(tstep / un[0]) - 1e-9));
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    /* Ticks as integer multiples of the step: no drifting sums, no "-0.0". */
    for (var tk = Math.ceil((t0 - D.time_ns) / tstep); tk * tstep + D.time_ns <= t1; tk++) {
      var tv = tk === 0 ? 0 : tk * tstep, xx = Math.round(L + (tv + D.time_ns - t0) / span * pw) + 0.5;
      ctx.beginPath(); ctx.moveTo(xx, Tm); ctx.lineTo(xx, Tm + ph + 4); ctx.stroke();
      ctx.fillText((tv / un[0]).toFixed(dec) + ' ' + un[1], xx, Tm + ph + 6);
    }
    ctx.fillText('time relative to the snapshot', L + pw / 2, Tm + ph + 20);

    /* Stacked columns, series by series (few style changes). */
    var base = new Float64Array(cols);
    for (s = 0; s < nS; s++) {
      ctx.fillStyle = series[s].color;
      for (c = 0; c < cols; c++) {
        var v = vals[c * nS + s];
        if (v <= 0) continue;
        var y0 = Tm + ph - base[c] * sy, y1 = Tm + ph - (base[c] + v) * sy;
        ctx.fillRect(L + c, y1, 1, Math.max(y0 - y1, 0.5));
        base[c] += v;
      }
    }
    ctx.strokeStyle = '#333';
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    for (c = 0; c < cols; c++) {
      var ry = Tm + ph - resv[c] * sy;
      if (c === 0) ctx.moveTo(L, ry); else ctx.lineTo(L + c, ry);
    }
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = '#b3261e';
    R.ooms.forEach(function (t) {
      var x = L + colOf(t);
      ctx.beginPath(); ctx.moveTo(x, Tm + ph); ctx.lineTo(x - 4, Tm + ph + 7); ctx.lineTo(x + 4, Tm + ph + 7); ctx.fill();
    });
    ctx.strokeStyle = '#8c959f';
    ctx.strokeRect(L + 0.5, Tm + 0.5, pw - 1, ph - 1);

    series.forEach(function (s) {
      var li = el('li'), sw = el('span', 'sw');
      sw.style.background = s.color;
      li.appendChild(sw);
      var lbl = el('span', 'lbl', s.label + (s.peak ? ' \u00b7 peak ' + fmtBytes(s.peak) : ''));
      lbl.title = s.label;
      li.appendChild(lbl);
      lg.appendChild(li);
    });
    var li = el('li');
    li.appendChild(el('span', 'sw line'));
    li.appendChild(el('span', 'lbl', D.chunks ? 'reserved (chunks)' : 'reserved (segments)'));
    lg.appendChild(li);
    if (R.ooms.length) {
      li = el('li');
      var sw = el('span', 'sw');
      sw.style.background = '#b3261e';
      li.appendChild(sw);
      li.appendChild(el('span', 'lbl', R.ooms.length + ' out-of-memory failures'));
      lg.appendChild(li);
    }

    $('tl-note').textContent = fmtInt(E.length) + ' history entries over ' + fmtNs(span) +
      ' (record: ' + H.record + ', ' + fmtInt(H.dropped) + ' dropped). Live bytes are block sizes; ' +
      'a block counts from its alloc to its free_completed, as pending from its free_requested.' +
      (R.pre ? ' ' + fmtInt(R.pre) + ' blocks allocated before the first kept entry count from the start.' : '');
    TL = { L: L, Tm: Tm, pw: pw, ph: ph, cols: cols, nS: nS, vals: vals, resv: resv, series: series,
           t0: t0, span: span, un: un };
  }

  function timelineHover(ev) {
    if (!TL) return;
    var r = $('timeline').getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    var c = Math.floor(x - TL.L);
    if (c < 0 || c >= TL.cols || y < TL.Tm || y > TL.Tm + TL.ph) { hideTip(); return; }
    var t = TL.t0 + (c + 0.5) / TL.cols * TL.span - D.time_ns, rows = [], tot = 0;
    for (var s = TL.nS - 1; s >= 0; s--) {
      var v = TL.vals[c * TL.nS + s];
      tot += v;
      if (v > 0) rows.push([fmtBytes(v), TL.series[s].label]);
    }
    rows.unshift(['reserved', fmtBytes(TL.resv[c])], ['live', fmtBytes(tot)]);
    showTip(ev.clientX, ev.clientY, (t / TL.un[0]).toFixed(3) + ' ' + TL.un[1] + ' (relative to the snapshot)', rows);
  }

  /* ---- Segment map -------------------------------------------------------
   * Each segment gets one or more rows of cells, one cell per block
   * (blocks_total cells, at least MIN_CELL px wide, wrapping to at most
   * MAX_LINES rows). Listed blocks are drawn over the uncarved background,
   * the rounding waste (block size - requested) hatched at the cell's end.
   * Only rows in view are drawn; rows are kept in arrays so that a pointer
   * position maps to a row by binary search and to a cell by division. */
  var MIN_CELL = 3, MAX_LINES = 64, ROW_H = 12, LINE_GAP = 2, SEG_GAP = 7, LABEL_W = 200;
  var M = null;
  var hatch = null;

  function buildMap() {
    var S = D.segments, scroll = $('map-scroll'), canvas = $('map');
    var w = contentWidth('map-section') - 2;
    var stripW = Math.max(40, w - LABEL_W - 6);
    var perLine = Math.max(1, Math.floor(stripW / MIN_CELL));
    var segs = [], lineSeg = [], lineNo = [], lineY = [], y = 4, placed = 0, stray = 0, uncarved = 0;
    for (var si = 0; si < S.length; si++) {
      var seg = S[si], n = Math.max(1, seg.blocks_total), bs = seg.block_size;
      var lines = Math.min(Math.ceil(n / perLine), MAX_LINES), cpl = Math.ceil(n / lines);
      var bl = seg.blocks, cells = new Float64Array(bl.length), ids = new Int32Array(bl.length), m = 0;
      for (var b = 0; b < bl.length; b++) {
        var off = bl[b].address - seg.address, cell = Math.floor(off / bs);
        if (off < 0 || cell >= n || off % bs !== 0) { stray++; continue; }
        cells[m] = cell; ids[m] = b; m++;
      }
      cells = cells.subarray(0, m); ids = ids.subarray(0, m);
      /* Written in address order; sort anyway, binary search relies on it. */
      for (b = 1; b < m && cells[b - 1] < cells[b]; b++);
      if (b < m) {
        var o = Array.from(ids.keys()).sort(function (p, q) { return cells[p] - cells[q]; });
        var c2 = new Float64Array(m), i2 = new Int32Array(m);
        o.forEach(function (p, q) { c2[q] = cells[p]; i2[q] = ids[p]; });
        cells = c2; ids = i2;
      }
      placed += m;
      uncarved += seg.uncarved_blocks;
      segs.push({ lines: lines, cpl: cpl, cellW: stripW / cpl, cells: cells, ids: ids, y: y, n: n });
      for (var ln = 0; ln < lines; ln++) {
        lineSeg.push(si); lineNo.push(ln); lineY.push(y);
        y += ROW_H + LINE_GAP;
      }
      y += SEG_GAP;
    }
    var totalH = y + 4, viewH = Math.min(totalH, 560);
    M = { w: w, x0: LABEL_W, stripW: stripW, segs: segs, lineSeg: lineSeg, lineNo: lineNo,
          lineY: lineY, totalH: totalH, viewH: viewH };
    status.setAttribute('data-blocks', String(placed));
    status.setAttribute('data-segments', String(S.length));

    $('map-note').textContent = S.length === 0 ? 'The pool has no segments.' :
      fmtInt(S.length) + ' segments \u00b7 ' + fmtInt(placed) + ' listed blocks \u00b7 ' + fmtInt(uncarved) +
      ' uncarved blocks. One cell per block, in address order; hover a block for its stack.' +
      (totalH > viewH ? ' Scroll the map for more segments.' : '') +
      (stray ? ' ' + stray + ' blocks lie outside their segment and are not drawn.' : '');
    scroll.hidden = S.length === 0;
    scroll.style.height = viewH + 'px';
    $('map-spacer').style.height = Math.max(0, totalH - viewH) + 'px';
    var ctx = sizeCanvas(canvas, w, viewH);
    hatch = hatchPattern(ctx, 'rgba(179,38,30,0.35)', '#b3261e', 1.5);
    drawMap();

    var lg = $('map-legend');
    lg.textContent = '';
    [['allocated', stateColor.allocated, ''], ['pending free', stateColor.pending_free, ''],
     ['cached', stateColor.cached, ''], ['uncarved (never handed out)', UNCARVED, ''],
     ['rounding waste (block size \u2212 requested)', '', 'hatch']].forEach(function (p) {
      var li = el('li'), sw = el('span', 'sw ' + p[2]);
      if (p[1]) sw.style.background = p[1];
      li.appendChild(sw);
      li.appendChild(el('span', 'lbl', p[0]));
      lg.appendChild(li);
    });
  }

  /* First index i with a[i] >= v (a sorted). */
  function lowerBound(a, v) {
    var lo = 0, hi = a.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (a[mid] < v) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function drawMap() {
    if (!M) return;
    var canvas = $('map'), ctx = canvas.getContext('2d'), top = $('map-scroll').scrollTop;
    var S = D.segments, x0 = M.x0;
    ctx.clearRect(0, 0, M.w, M.viewH);
    ctx.font = '10px ui-monospace, "DejaVu Sans Mono", monospace';
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'left';
    for (var li = Math.max(0, lowerBound(M.lineY, top - ROW_H)); li < M.lineY.length; li++) {
      var y = M.lineY[li] - top;
      if (y > M.viewH) break;
      var si = M.lineSeg[li], ln = M.lineNo[li], seg = S[si], g = M.segs[si];
      var c0 = ln * g.cpl, c1 = Math.min(g.n, c0 + g.cpl), cw = g.cellW;
      if (ln === 0 || ln === 1) {
        ctx.fillStyle = '#1f2328';
        var text = ln === 0 ? hex(seg.address) + ' ' + fmtBytes(seg.block_size) + ' \u00d7' + seg.blocks_total
                            : seg.flags.join(' ') + (seg.tail_bytes ? ' tail ' + fmtBytes(seg.tail_bytes) : '');
        ctx.fillText(text, 4, y + ROW_H / 2, LABEL_W - 10);
      }
      ctx.fillStyle = UNCARVED;
      ctx.fillRect(x0, y, (c1 - c0) * cw, ROW_H);
      var gap = cw >= 4 ? 1 : 0;
      for (var k = lowerBound(g.cells, c0); k < g.cells.length && g.cells[k] < c1; k++) {
        var blk = seg.blocks[g.ids[k]], x = x0 + (g.cells[k] - c0) * cw, bw = Math.max(cw - gap, 0.75);
        ctx.fillStyle = stateColor[blk.state];
        ctx.fillRect(x, y, bw, ROW_H);
        if (blk.state !== 'cached' && blk.requested_size < seg.block_size) {
          var used = bw * blk.requested_size / seg.block_size;
          if (bw - used >= 1) {
            ctx.fillStyle = hatch;
            ctx.fillRect(x + used, y, bw - used, ROW_H);
          }
        }
      }
    }
  }

  /* The segment and cell under a point of the map, or null. */
  function mapHit(clientX, clientY) {
    if (!M) return null;
    var r = $('map').getBoundingClientRect(), x = clientX - r.left;
    var cy = clientY - r.top + $('map-scroll').scrollTop;
    var li = lowerBound(M.lineY, cy + 1) - 1;
    if (li < 0 || cy - M.lineY[li] >= ROW_H) return null;
    var si = M.lineSeg[li], g = M.segs[si];
    if (x < M.x0) return { seg: si, label: true };
    var cell = M.lineNo[li] * g.cpl + Math.floor((x - M.x0) / g.cellW);
    if (x - M.x0 >= g.cpl * g.cellW || cell >= g.n) return null;
    var k = lowerBound(g.cells, cell);
    return { seg: si, cell: cell, block: k < g.cells.length && g.cells[k] === cell ? g.ids[k] : -1 };
  }

  var mapPointer = null; /* the pointer over the map, for scrolling */
  function mapHover(ev) {
    mapPointer = { clientX: ev.clientX, clientY: ev.clientY };
    var h = mapHit(ev.clientX, ev.clientY);
    if (!h) { hideTip(); return; }
    var seg = D.segments[h.seg], bs = seg.block_size;
    if (h.label) {
      var cnt = { allocated: 0, pending_free: 0, cached: 0 };
      seg.blocks.forEach(function (b) { cnt[b.state]++; });
      showTip(ev.clientX, ev.clientY, 'segment ' + hex(seg.address), [
        ['size', fmtBytes(seg.size) + ' (' + fmtInt(seg.size) + ' B)'],
        ['blocks', fmtInt(seg.blocks_total) + ' \u00d7 ' + fmtBytes(bs) + ' (class ' + seg['class'] + ')'],
        ['allocated', fmtInt(cnt.allocated)], ['pending free', fmtInt(cnt.pending_free)],
        ['cached', fmtInt(cnt.cached)], ['uncarved', fmtInt(seg.uncarved_blocks)],
        ['tail', fmtBytes(seg.tail_bytes)], ['flags', seg.flags.join(', ') || '-']]);
      return;
    }
    var addr = seg.address + h.cell * bs;
    if (h.block < 0) {
      showTip(ev.clientX, ev.clientY, 'block ' + hex(addr), [
        ['state', 'uncarved (never handed out)'], ['size', fmtBytes(bs)],
        ['segment', hex(seg.address) + ', block ' + h.cell + ' of ' + seg.blocks_total]]);
      return;
    }
    var b = seg.blocks[h.block], live = b.state !== 'cached';
    var waste = live ? bs - b.requested_size : 0;
    status.setAttribute('data-hover', String(b.address));
    showTip(ev.clientX, ev.clientY, 'block ' + hex(b.address), [
      ['state', b.state],
      ['size', fmtBytes(bs) + ' (' + fmtInt(bs) + ' B)'],
      ['requested', live ? fmtBytes(b.requested_size) + ' (' + fmtInt(b.requested_size) + ' B)' : '-'],
      ['waste', live ? fmtBytes(waste) + ' (' + pct(waste, bs) + ' of the block)' : '-'],
      ['thread', b.thread === null ? '-' : String(b.thread)],
      ['streams', b.streams.length ? b.streams.join(', ') : '-'],
      ['segment', hex(seg.address) + ', block ' + h.cell + ' of ' + seg.blocks_total],
      ['site', siteLabel(b.stack)]], b.stack);
  }

  /* #hover=ADDRESS (decimal or 0x hex) hovers that block as a pointer
   * would: the event goes through the same hit test, so the tests check
   * the coordinates and the tooltip end to end. */
  function hoverFromHash() {
    var m = /[#&]hover=([^&]+)/.exec(location.hash);
    if (!m || !M) return;
    var addr = Number(decodeURIComponent(m[1])), S = D.segments;
    for (var si = 0; si < S.length; si++) {
      var seg = S[si], g = M.segs[si];
      if (addr < seg.address || addr >= seg.address + seg.size) continue;
      var cell = Math.floor((addr - seg.address) / seg.block_size);
      if (cell >= g.n) break;
      var ln = Math.floor(cell / g.cpl), lineTop = g.y + ln * (ROW_H + LINE_GAP);
      var scroll = $('map-scroll');
      scroll.scrollTop = Math.max(0, lineTop - 40);
      drawMap();
      var r = $('map').getBoundingClientRect();
      var cx = r.left + M.x0 + (cell - ln * g.cpl + 0.5) * g.cellW;
      var cy = r.top + lineTop - scroll.scrollTop + ROW_H / 2;
      $('map').dispatchEvent(new MouseEvent('mousemove', { clientX: cx, clientY: cy, bubbles: true }));
      return;
    }
    status.setAttribute('data-hover', 'none');
  }


  /* ---- Chunks ------------------------------------------------------------
   * The arena's chunks (what the backend gave), one row each, its address
   * range across the width: the segments carved from it, each drawn as the
   * bytes of its allocated, pending and cached blocks and the rest
   * (uncarved, tail) in that order, and its free ranges ("free in chunks").
   * A segment that crosses into the next chunk of its run is drawn in both
   * rows. Snapshots written before issue 21 have no chunks: no section. */
  var CH_ROW = 16, CH_GAP = 4;
  /* Rows drawn: one canvas holds them all, and browsers refuse canvases
   * much over 32,000 pixels high. */
  function chunkRowsMax() {
    return Math.floor(32000 / (window.devicePixelRatio || 1) / (CH_ROW + CH_GAP)) - 1;
  }
  var C = null;
  var freePattern = null;

  function segParts(seg) {
    var bs = seg.block_size, a = 0, p = 0, c = 0;
    seg.blocks.forEach(function (b) {
      if (b.state === 'allocated') a += bs; else if (b.state === 'pending_free') p += bs; else c += bs;
    });
    return [[a, stateColor.allocated], [p, stateColor.pending_free], [c, stateColor.cached],
            [Math.max(0, seg.size - a - p - c), UNCARVED]];
  }

  function buildChunks() {
    var sec = $('chunks-section'), CH = D.chunks;
    if (!Array.isArray(CH)) { sec.hidden = true; C = null; return; }
    sec.hidden = false;
    var S = D.segments, order = S.map(function (s, i) { return i; })
      .sort(function (i, j) { return S[i].address - S[j].address; });
    var segStart = order.map(function (i) { return S[i].address; });
    var rows = Math.min(CH.length, chunkRowsMax()), gaps = 0, inside = 0, freeBytes = 0;
    for (var k = 0; k < rows; k++) {
      var ck = CH[k];
      gaps += ck.free.length;
      ck.free.forEach(function (r) { freeBytes += r[1]; });
      /* segments starting in this chunk */
      inside += lowerBound(segStart, ck.address + ck.size) - lowerBound(segStart, ck.address);
    }
    var w = contentWidth('chunks-section') - 2;
    var stripW = Math.max(40, w - LABEL_W - 6), h = rows * (CH_ROW + CH_GAP) + CH_GAP;
    C = { w: w, x0: LABEL_W, stripW: stripW, rows: rows, order: order, segStart: segStart,
          parts: order.map(function (i) { return segParts(S[i]); }) };
    status.setAttribute('data-chunks', String(rows));
    status.setAttribute('data-chunk-gaps', String(gaps));
    status.setAttribute('data-chunk-segments', String(inside));
    $('chunks-note').textContent = fmtInt(CH.length) + ' chunks \u00b7 ' + fmtInt(inside) +
      ' segments carved from them \u00b7 ' + fmtInt(gaps) + ' free ranges, ' + fmtBytes(freeBytes) +
      ' free in chunks. One row per chunk, its address range across the width; hover for details.' +
      (CH.length > rows ? ' Only the first ' + fmtInt(rows) + ' chunks are drawn.' : '');
    var ctx = sizeCanvas($('chunks'), w, h);
    freePattern = hatchPattern(ctx, '#ffffff', '#b6c2cf', 1);
    drawChunks(ctx);

    var lg = $('chunks-legend');
    lg.textContent = '';
    [['allocated', stateColor.allocated, ''], ['pending free', stateColor.pending_free, ''],
     ['cached', stateColor.cached, ''], ['uncarved and tails (in a segment)', UNCARVED, ''],
     ['free in chunks', '', 'freechunk'], ['in no segment and no free range (busy pool)', UNLISTED, '']
    ].forEach(function (p) {
      var li = el('li'), sw = el('span', 'sw ' + p[2]);
      if (p[1]) sw.style.background = p[1];
      li.appendChild(sw);
      li.appendChild(el('span', 'lbl', p[0]));
      lg.appendChild(li);
    });
  }

  function drawChunks(ctx) {
    var CH = D.chunks, S = D.segments;
    ctx.font = '10px ui-monospace, "DejaVu Sans Mono", monospace';
    ctx.textBaseline = 'middle';
    for (var k = 0; k < C.rows; k++) {
      var ck = CH[k], y = CH_GAP + k * (CH_ROW + CH_GAP), x0 = C.x0, sw = C.stripW;
      var sx = function (a) { return x0 + sw * Math.min(1, Math.max(0, (a - ck.address) / ck.size)); };
      ctx.fillStyle = '#1f2328';
      ctx.fillText(hex(ck.address) + ' ' + fmtBytes(ck.size), 4, y + CH_ROW / 2, LABEL_W - 10);
      ctx.fillStyle = UNLISTED;
      ctx.fillRect(x0, y, sw, CH_ROW);
      ctx.fillStyle = freePattern;
      ck.free.forEach(function (r) { ctx.fillRect(sx(r[0]), y, Math.max(sx(r[0] + r[1]) - sx(r[0]), 1), CH_ROW); });
      /* segments overlapping the chunk: those starting before its end,
       * back to the first that may reach into it */
      var end = ck.address + ck.size;
      for (var q = lowerBound(C.segStart, end) - 1; q >= 0; q--) {
        var seg = S[C.order[q]];
        if (seg.address + seg.size <= ck.address) break;
        var a = seg.address;
        C.parts[q].forEach(function (part) {
          if (part[0] <= 0) return;
          var xa = sx(a), xb = sx(a + part[0]);
          if (xb > xa) { ctx.fillStyle = part[1]; ctx.fillRect(xa, y, Math.max(xb - xa, 0.75), CH_ROW); }
          a += part[0];
        });
        ctx.fillStyle = '#ffffff'; /* its boundaries */
        if (seg.address > ck.address) ctx.fillRect(sx(seg.address), y, 1, CH_ROW);
      }
      ctx.strokeStyle = '#8c959f';
      ctx.strokeRect(x0 + 0.5, y + 0.5, sw - 1, CH_ROW - 1);
    }
  }

  /* What is under a point of the chunk map: {chunk, address} or null. */
  function chunkHit(clientX, clientY) {
    if (!C) return null;
    var r = $('chunks').getBoundingClientRect(), x = clientX - r.left, y = clientY - r.top;
    var k = Math.floor((y - CH_GAP) / (CH_ROW + CH_GAP));
    if (k < 0 || k >= C.rows || y - CH_GAP - k * (CH_ROW + CH_GAP) >= CH_ROW) return null;
    var ck = D.chunks[k];
    if (x < C.x0) return { chunk: k, label: true };
    if (x >= C.x0 + C.stripW) return null;
    return { chunk: k, address: ck.address + Math.floor((x - C.x0) / C.stripW * ck.size) };
  }

  function chunkHover(ev) {
    var h = chunkHit(ev.clientX, ev.clientY), CH = D.chunks;
    if (!h) { hideTip(); return; }
    var ck = CH[h.chunk], free = 0, largest = 0;
    ck.free.forEach(function (r) { free += r[1]; largest = Math.max(largest, r[1]); });
    if (h.label) {
      status.setAttribute('data-chunk-hover', 'chunk:' + ck.address);
      showTip(ev.clientX, ev.clientY, 'chunk ' + hex(ck.address), [
        ['size', fmtBytes(ck.size) + ' (' + fmtInt(ck.size) + ' B)'],
        ['free in chunk', fmtBytes(free) + ' in ' + plural(ck.free.length, 'range') +
          (largest ? ', largest ' + fmtBytes(largest) : '')],
        ['node', ck.node === undefined ? '-' : String(ck.node)], ['flags', ck.flags.join(', ') || '-']]);
      return;
    }
    var a = h.address, q = lowerBound(C.segStart, a + 1) - 1;
    var seg = q >= 0 ? D.segments[C.order[q]] : null;
    if (seg && a < seg.address + seg.size) {
      var parts = C.parts[q];
      status.setAttribute('data-chunk-hover', 'segment:' + seg.address);
      showTip(ev.clientX, ev.clientY, 'segment ' + hex(seg.address) + ' in chunk ' + hex(ck.address), [
        ['size', fmtBytes(seg.size) + (seg.address + seg.size > ck.address + ck.size || seg.address < ck.address
          ? ' (crosses into the next chunk of its run)' : '')],
        ['blocks', fmtInt(seg.blocks_total) + ' \u00d7 ' + fmtBytes(seg.block_size)],
        ['allocated', fmtBytes(parts[0][0])], ['pending free', fmtBytes(parts[1][0])],
        ['cached', fmtBytes(parts[2][0])], ['uncarved and tail', fmtBytes(parts[3][0])]]);
      return;
    }
    for (var j = 0; j < ck.free.length; j++) {
      var r = ck.free[j];
      if (a >= r[0] && a < r[0] + r[1]) {
        status.setAttribute('data-chunk-hover', 'free:' + r[0]);
        showTip(ev.clientX, ev.clientY, 'free in chunk ' + hex(ck.address), [
          ['range', hex(r[0]) + ' \u2013 ' + hex(r[0] + r[1])],
          ['size', fmtBytes(r[1]) + ' (' + fmtInt(r[1]) + ' B)'],
          ['chunk', fmtBytes(free) + ' free in ' + plural(ck.free.length, 'range')]]);
        return;
      }
    }
    status.setAttribute('data-chunk-hover', 'none:' + a);
    showTip(ev.clientX, ev.clientY, 'chunk ' + hex(ck.address), [
      ['address', hex(a)], ['state', 'in no segment and no free range (a snapshot of a busy pool)']]);
  }

  /* #chunk=ADDRESS hovers the chunk map there, as #hover does the map. */
  function chunkFromHash() {
    var m = /[#&]chunk=([^&]+)/.exec(location.hash);
    if (!m || !C) return;
    var addr = Number(decodeURIComponent(m[1])), CH = D.chunks;
    for (var k = 0; k < C.rows; k++) {
      var ck = CH[k];
      if (addr < ck.address || addr >= ck.address + ck.size) continue;
      var y = CH_GAP + k * (CH_ROW + CH_GAP), box = $('chunks-scroll');
      box.scrollTop = Math.max(0, y - 40);
      var r = $('chunks').getBoundingClientRect();
      /* the middle of the pixel column holding addr */
      var col = Math.floor((addr - ck.address) / ck.size * C.stripW);
      $('chunks').dispatchEvent(new MouseEvent('mousemove', {
        clientX: r.left + C.x0 + col + 0.5, clientY: r.top + y + CH_ROW / 2, bubbles: true }));
      return;
    }
    status.setAttribute('data-chunk-hover', 'none');
  }

  /* ---- Top sites -------------------------------------------------------- */
  var TOP_ROWS = 25;
  function renderSites() {
    var by = new Map(), liveBytes = 0;
    D.segments.forEach(function (seg) {
      seg.blocks.forEach(function (b) {
        if (b.state === 'cached') return;
        var label = siteLabel(b.stack), s = by.get(label);
        if (!s) { s = { label: label, blocks: 0, bytes: 0, req: 0, pend: 0, stacks: new Map() }; by.set(label, s); }
        s.blocks++; s.bytes += seg.block_size; s.req += b.requested_size;
        if (b.state === 'pending_free') s.pend += seg.block_size;
        var key = b.stack === null ? -1 : b.stack;
        s.stacks.set(key, (s.stacks.get(key) || 0) + seg.block_size);
        liveBytes += seg.block_size;
      });
    });
    var rows = Array.from(by.values()).sort(function (a, b) { return b.bytes - a.bytes || b.blocks - a.blocks; });
    var t = $('sites');
    t.textContent = '';
    $('sites-note').textContent = rows.length === 0 ? 'No live blocks (allocated or pending free).' :
      fmtInt(rows.length) + ' sites hold ' + fmtBytes(liveBytes) + ' in live blocks (allocated and ' +
      'pending free). A site is the innermost frame of the allocation\'s stack; hover a site for the ' +
      'stack holding most of its bytes.';
    if (rows.length === 0) return;
    var head = el('tr');
    ['#', 'site', 'blocks', 'live bytes', '% of live', 'requested', 'waste', 'pending free'].forEach(function (h, i) {
      head.appendChild(el('th', i === 1 ? 'site' : '', h));
    });
    t.appendChild(head);
    function row(r, idx, cls) {
      var tr = el('tr', cls);
      [idx, r.label, fmtInt(r.blocks), fmtBytes(r.bytes), pct(r.bytes, liveBytes), fmtBytes(r.req),
       fmtBytes(r.bytes - r.req) + ' (' + pct(r.bytes - r.req, r.bytes) + ')', fmtBytes(r.pend)
      ].forEach(function (v, i) { tr.appendChild(el('td', i === 1 ? 'site' : '', String(v))); });
      if (r.stacks) {
        var best = -1, bb = -1;
        r.stacks.forEach(function (v, k) { if (v > bb) { bb = v; best = k; } });
        tr.cells[1].title = stackText(best < 0 ? null : best);
      }
      t.appendChild(tr);
    }
    rows.slice(0, TOP_ROWS).forEach(function (r, i) { row(r, i + 1, ''); });
    if (rows.length > TOP_ROWS) {
      var o = { label: 'other (' + (rows.length - TOP_ROWS) + ' sites)', blocks: 0, bytes: 0, req: 0, pend: 0 };
      rows.slice(TOP_ROWS).forEach(function (r) { o.blocks += r.blocks; o.bytes += r.bytes; o.req += r.req; o.pend += r.pend; });
      row(o, '', 'other');
    }
  }

  /* ---- Start ------------------------------------------------------------ */
  function load() {
    var raw = $('snapshot').textContent.trim();
    if (raw.slice(0, 2) === '/*')
      throw new Error('this page holds no snapshot: it is the viewer template; ' +
                      'write a page with `pinpool snapshot html FILE -o OUT.html`');
    var d = JSON.parse(raw);
    /* The text is no longer needed; a large snapshot's would otherwise stay
     * in memory beside the parsed copy (and slow down DOM serializers such
     * as the tests' chromium --dump-dom by seconds). */
    $('snapshot').textContent = '';
    if (!d || d.format !== 'pinpool-snapshot') throw new Error('not a pinpool snapshot (format is ' + (d && d.format) + ')');
    if (d.version !== 1) throw new Error('snapshot version ' + d.version + ' is not supported (this viewer reads version 1)');
    D = d;
  }

  var t0 = performance.now();
  guarded('loading the snapshot', load);
  if (D) {
    guarded('header', renderHeader);
    guarded('timeline', renderTimeline);
    guarded('chunk map', buildChunks);
    guarded('segment map', buildMap);
    guarded('top sites', renderSites);

    $('timeline').addEventListener('mousemove', function (e) { guarded('timeline hover', function () { timelineHover(e); }); });
    $('timeline').addEventListener('mouseleave', hideTip);
    $('map').addEventListener('mousemove', function (e) { guarded('map hover', function () { mapHover(e); }); });
    $('map').addEventListener('mouseleave', function () { mapPointer = null; hideTip(); });
    $('chunks').addEventListener('mousemove', function (e) { guarded('chunk hover', function () { chunkHover(e); }); });
    $('chunks').addEventListener('mouseleave', hideTip);
    /* Scrolling moves other blocks under a still pointer: hit-test again. */
    var pendingDraw = false;
    $('map-scroll').addEventListener('scroll', function () {
      if (pendingDraw) return;
      pendingDraw = true;
      requestAnimationFrame(function () {
        pendingDraw = false;
        guarded('segment map', function () {
          drawMap();
          if (mapPointer) mapHover(mapPointer); else hideTip();
        });
      });
    });
    guarded('hover', hoverFromHash); /* needs the listeners above */
    guarded('chunk hover', chunkFromHash);
    var lastW = window.innerWidth, timer = 0;
    window.addEventListener('resize', function () {
      if (window.innerWidth === lastW) return;
      lastW = window.innerWidth;
      clearTimeout(timer);
      timer = setTimeout(function () {
        guarded('timeline', renderTimeline);
        guarded('chunk map', buildChunks);
        guarded('segment map', buildMap);
      }, 150);
    });
  }
  status.setAttribute('data-render-ms', String(Math.round(performance.now() - t0)));
  status.setAttribute('data-ready', '1');
})();
