// flowrun's live console page: draws the graph (SVG), follows the run over
// Server-Sent Events (/api/stream) and sends the POST controls with the token.
// Plain JS, no library, no outside network (docs/console.md).
'use strict';

(function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const STATES = ['busy', 'idle', 'waiting_credit', 'waiting_request', 'initializing', 'restarting', 'paused',
                  'failed', 'done', 'stopped', 'remote'];
  const NODE_H = 76, REP_H = 22;  // as hub.cpp layout_graph draws the boxes

  // -- state -------------------------------------------------------------------------------
  const st = {
    token: '',
    graph: null,           // /api/graph
    nodes: {},             // name -> node summary (from frames)
    edges: {},             // name -> edge (from frames)
    expanded: {},          // replica groups shown expanded
    selected: '',          // node in the detail panel
    series: {},            // "node/name" -> {node, name, points: [[t, v]]}
    phases: [],            // [{t_s, node, phase}]
    events: [],            // newest last
    finished: false,
    lastDetail: 0,
    lastEventSeq: 0,
  };

  // The token: ?token=... (the URL flowrun prints), else what was typed in this tab.
  const params = new URLSearchParams(location.search);
  st.token = params.get('token') || sessionStorage.getItem('flowrun-token') || '';
  if (params.get('token')) sessionStorage.setItem('flowrun-token', st.token);

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, text) => {
    const e = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };

  function fmtNum(x, digits) {
    if (x === null || x === undefined || !isFinite(x)) return '–';
    const a = Math.abs(x);
    if (a >= 1e9) return (x / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (x / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (x / 1e3).toFixed(1) + 'k';
    if (a >= 100) return x.toFixed(0);
    if (a >= 1) return x.toFixed(digits === undefined ? 1 : digits);
    if (a === 0) return '0';
    return x.toPrecision(3);
  }
  function fmtBytes(b) {
    if (b === null || b === undefined || !isFinite(b)) return '–';
    if (b >= 1073741824) return (b / 1073741824).toFixed(2) + ' GiB';
    if (b >= 1048576) return (b / 1048576).toFixed(1) + ' MiB';
    if (b >= 1024) return (b / 1024).toFixed(1) + ' KiB';
    return Math.round(b) + ' B';
  }
  const fmtRate = (r) => fmtNum(r) + '/s';
  const fmtSec = (x) => (x === null || x === undefined || !isFinite(x)) ? '–' : x.toFixed(x < 10 ? 2 : 1) + ' s';

  function api(path, opts) {
    const o = Object.assign({headers: {}}, opts || {});
    if (st.token) o.headers['Authorization'] = 'Bearer ' + st.token;
    return fetch(path, o).then(async (res) => {
      let body = null;
      try { body = await res.json(); } catch (e) { body = {}; }
      if (!res.ok) throw new Error(body.error || (res.status + ' ' + res.statusText));
      return body;
    });
  }
  function tokenQuery() { return st.token ? '?token=' + encodeURIComponent(st.token) : ''; }

  function message(text, kind) {
    const m = $('message');
    m.hidden = !text;
    m.textContent = text || '';
    m.className = 'message' + (kind ? ' ' + kind : '');
  }

  // -- controls ----------------------------------------------------------------------------
  function control(action) {
    if (!st.token) {
      $('token-box').hidden = false;
      message('This action changes the run: it needs the console token (flowrun printed it at start).', 'err');
      return;
    }
    if (action === 'stop' && !confirm('Stop the run? It drains and stops as on Ctrl-C.')) return;
    api('/api/' + action, {method: 'POST'})
      .then((r) => message(r.message || action, 'ok'))
      .catch((e) => {
        message(action + ': ' + e.message, 'err');
        if (/token/.test(e.message)) $('token-box').hidden = false;
      });
  }
  for (const a of ['pause', 'resume', 'stop', 'checkpoint']) $('btn-' + a).addEventListener('click', () => control(a));
  $('token-save').addEventListener('click', () => {
    st.token = $('token-input').value.trim();
    sessionStorage.setItem('flowrun-token', st.token);
    $('token-box').hidden = true;
    message('token set for this tab', 'ok');
  });

  // -- legend ------------------------------------------------------------------------------
  for (const s of STATES) {
    const span = el('span');
    const i = el('i');
    i.style.background = 'var(--' + s + ')';
    span.appendChild(i);
    span.appendChild(document.createTextNode(s.replace('_', ' ')));
    $('legend').appendChild(span);
  }

  // -- layout: the server's (GET /api/graph "layout", hub.cpp layout_graph: columns by longest
  // path, fitted to a 1600-pixel window); an expanded replica group pushes the boxes below it down
  function layout() {
    const L = st.graph.layout;
    const extra = (n) => {
      const info = st.graph.nodes.find((x) => x.name === n);
      const reps = (info && info.replicas) || 1;
      return reps > 1 && st.expanded[n] ? reps * (REP_H + 4) + 4 : 0;
    };
    const bandExtra = {};  // per band: the most any of its columns grew
    const colExtra = {};   // per band and column: how much it has grown so far, top to bottom
    const sorted = L.nodes.slice().sort((p, q) => p.band - q.band || p.column - q.column || p.y - q.y);
    const box = {};
    for (const n of sorted) {
      const key = n.band + ':' + n.column;
      colExtra[key] = colExtra[key] || 0;
      box[n.name] = {x: n.x, y: n.y + colExtra[key], w: n.w, h: n.h + extra(n.name), band: n.band};
      colExtra[key] += extra(n.name);
      bandExtra[n.band] = Math.max(bandExtra[n.band] || 0, colExtra[key]);
    }
    let shift = 0, height = L.height;
    const bands = Object.keys(bandExtra).map(Number).sort((p, q) => p - q);
    const before = {};
    for (const b of bands) { before[b] = shift; shift += bandExtra[b]; }
    for (const name of Object.keys(box)) box[name].y += before[box[name].band] || 0;
    return {box, width: L.width, height: height + shift};
  }

  // -- drawing -------------------------------------------------------------------------------
  function drawGraph() {
    const svg = $('graph');
    svg.textContent = '';
    const {box, width, height} = layout();
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    svg.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    const defs = el('svg:defs');
    const marker = el('svg:marker', {id: 'arrow', viewBox: '0 0 10 10', refX: '9', refY: '5', markerWidth: '7',
                                     markerHeight: '7', orient: 'auto-start-reverse'});
    marker.appendChild(el('svg:path', {d: 'M 0 0 L 10 5 L 0 10 z', fill: '#7b8794'}));
    defs.appendChild(marker);
    svg.appendChild(defs);
    const edgeLayer = el('svg:g', {class: 'edges'});
    const nodeLayer = el('svg:g', {class: 'nodes'});
    svg.appendChild(edgeLayer);
    svg.appendChild(nodeLayer);
    // edges (several between the same two nodes are spread apart)
    const pairCount = {};
    for (const e of st.graph.edges) {
      const a = box[e.from], b = box[e.to];
      if (!a || !b) continue;
      const key = e.from + '>' + e.to;
      const k = pairCount[key] = (pairCount[key] || 0) + 1;
      const off = (k - 1) * 14;
      let d, lx, ly;
      if (!e.feedback && b.x > a.x) {
        const x1 = a.x + a.w, y1 = a.y + Math.min(a.h, NODE_H) / 2 + off, x2 = b.x, y2 = b.y + Math.min(b.h, NODE_H) / 2 + off;
        const c = (x2 - x1) / 2;
        d = `M ${x1} ${y1} C ${x1 + c} ${y1}, ${x2 - c} ${y2}, ${x2} ${y2}`;
        lx = (x1 + x2) / 2; ly = (y1 + y2) / 2 - 6;
      } else {
        // backwards (feedback) or within a layer: a loop under the nodes
        const x1 = a.x + a.w / 2 + off, y1 = a.y + a.h, x2 = b.x + b.w / 2 - off, y2 = b.y + b.h;
        const low = Math.max(y1, y2) + 40 + off;
        d = `M ${x1} ${y1} C ${x1} ${low}, ${x2} ${low}, ${x2} ${y2}`;
        lx = (x1 + x2) / 2; ly = low - 8;
      }
      const ge = el('svg:g', {class: 'edge' + (e.feedback ? ' feedback' : ''), 'data-edge': e.name});
      const title = el('svg:title', {}, `${e.name}\n${e.dispatch}, credit ${e.credit}, ${e.transport}${e.feedback ? ', feedback' : ''}`);
      ge.appendChild(title);
      ge.appendChild(el('svg:path', {d, 'marker-end': 'url(#arrow)'}));
      const bg = el('svg:rect', {class: 'label-bg', x: lx - 60, y: ly - 11, width: 120, height: 14, rx: 3});
      ge.appendChild(bg);
      const label = el('svg:text', {class: 'edge-label', x: lx, y: ly, 'text-anchor': 'middle', 'data-edge': e.name,
                                    'data-msgs-per-s': '0'}, '');
      ge.appendChild(label);
      edgeLayer.appendChild(ge);
    }
    // nodes
    for (const n of st.graph.nodes) {
      const b = box[n.name];
      const reps = n.replicas || 1;
      const gn = el('svg:g', {class: 'node state-initializing', 'data-node': n.name,
                              transform: `translate(${b.x},${b.y})`});
      gn.appendChild(el('svg:title', {}, `${n.name} (${n.kind})` + (reps > 1 ? ` x${reps}` : '')));
      gn.appendChild(el('svg:rect', {class: 'box', width: b.w, height: b.h, rx: 6}));
      gn.appendChild(el('svg:text', {class: 'name', x: 10, y: 18}, n.name));
      gn.appendChild(el('svg:text', {class: 'kind', x: 10, y: 34}, n.kind + (reps > 1 ? `  ×${reps}` : '')));
      gn.appendChild(el('svg:text', {class: 'line', x: 10, y: 51}, 'initializing'));
      gn.appendChild(el('svg:text', {class: 'rates', x: 10, y: 67}, ''));
      if (reps > 1) {
        const t = el('svg:g', {class: 'toggle', transform: `translate(${b.w - 26},6)`, 'data-toggle': n.name});
        t.appendChild(el('svg:rect', {width: 20, height: 18, rx: 3}));
        t.appendChild(el('svg:text', {x: 10, y: 13, 'text-anchor': 'middle'}, st.expanded[n.name] ? '−' : '+'));
        t.addEventListener('click', (ev) => {
          ev.stopPropagation();
          st.expanded[n.name] = !st.expanded[n.name];
          drawGraph();
          update();
        });
        gn.appendChild(t);
        if (st.expanded[n.name]) {
          for (let r = 0; r < reps; ++r) {
            const y = NODE_H + r * (REP_H + 4);
            gn.appendChild(el('svg:rect', {class: 'replica state-initializing', x: 8, y, width: b.w - 16, height: REP_H,
                                           'data-replica': r}));
            gn.appendChild(el('svg:text', {class: 'replica-line', x: 14, y: y + 15, 'data-replica': r},
                              `[${r}] initializing`));
          }
        }
      }
      gn.addEventListener('click', () => select(n.name));
      nodeLayer.appendChild(gn);
    }
    if (st.selected) markSelected();
  }

  // Applies the latest states and rates to the drawing.
  function update() {
    for (const g of document.querySelectorAll('#graph g.node')) {
      const name = g.getAttribute('data-node');
      const n = st.nodes[name];
      if (!n) continue;
      const cls = 'node state-' + n.state + (name === st.selected ? ' selected' : '');
      if (g.getAttribute('class') !== cls) g.setAttribute('class', cls);
      g.setAttribute('data-state', n.state);
      const r = n.rates;
      const inout = n.source ? fmtRate(r.msgs_out_per_s) + ' out' : fmtRate(r.handled_per_s) + ' handled';
      g.querySelector('text.line').textContent = n.state.replace('_', ' ') + (n.phase ? ' · ' + n.phase : '');
      // asynchronous RLHF: the policy version the node holds and the seconds it waited for input
      const async = n.policy_version == null ? '' : ` · v${n.policy_version} · waited ${fmtSec(n.totals.wait_s)}`;
      g.querySelector('text.rates').textContent = `${inout} · busy ${Math.round(n.load.utilization * 100)}%${async}`;
      for (const rr of g.querySelectorAll('rect.replica')) {
        const k = +rr.getAttribute('data-replica');
        const rs = (n.replica_states || [])[k];
        if (rs) rr.setAttribute('class', 'replica state-' + rs.state);
      }
      for (const t of g.querySelectorAll('text.replica-line')) {
        const k = +t.getAttribute('data-replica');
        const rs = (n.replica_states || [])[k];
        if (rs) t.textContent = `[${k}] ${rs.state.replace('_', ' ')}` + (rs.phase ? ` · ${rs.phase}` : '');
      }
    }
    for (const t of document.querySelectorAll('#graph text.edge-label')) {
      const e = st.edges[t.getAttribute('data-edge')];
      if (!e) continue;
      const mps = e.msgs_per_s || 0;
      t.textContent = `${fmtNum(mps)} msg/s · ${fmtBytes(e.bytes_per_s)}/s`;
      t.setAttribute('data-msgs-per-s', String(mps));
      t.parentNode.setAttribute('class', 'edge' + (e.feedback ? ' feedback' : '') + (mps > 0 ? ' active' : ''));
      const bg = t.previousSibling;
      try {
        const w = t.getComputedTextLength() + 10;
        bg.setAttribute('width', w);
        bg.setAttribute('x', +t.getAttribute('x') - w / 2);
      } catch (e2) { /* not laid out yet */ }
    }
  }

  function markSelected() {
    for (const g of document.querySelectorAll('#graph g.node')) {
      const on = g.getAttribute('data-node') === st.selected;
      g.classList.toggle('selected', on);
    }
  }

  // -- node detail ---------------------------------------------------------------------------
  function select(name) {
    st.selected = name;
    markSelected();
    loadDetail();
  }

  function table(rows, head) {
    const t = el('table');
    if (head) {
      const tr = el('tr');
      for (const h of head) tr.appendChild(el('th', {}, h));
      t.appendChild(tr);
    }
    for (const r of rows) {
      const tr = el('tr');
      for (const c of r) {
        const td = el('td');
        if (c && typeof c === 'object' && c.node) td.appendChild(c.node);
        else td.textContent = c;
        if (typeof c === 'number') td.className = 'num';
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
    return t;
  }

  function loadDetail() {
    const name = st.selected;
    if (!name) return;
    st.lastDetail = Date.now();
    api('/api/nodes/' + encodeURIComponent(name)).then((d) => {
      if (name !== st.selected) return;
      const box = $('detail');
      box.textContent = '';
      box.setAttribute('data-node', name);
      const h = el('div', {class: 'detail-head'});
      h.appendChild(el('b', {class: 'detail-name'}, d.name));
      h.appendChild(document.createTextNode(` (${d.kind}${d.replicas > 1 ? ' ×' + d.replicas : ''}) `));
      const chip = el('span', {class: 'state-chip detail-state'}, d.state.replace('_', ' '));
      chip.style.background = 'var(--' + d.state + ')';
      h.appendChild(chip);
      h.appendChild(document.createTextNode(` for ${fmtSec(d.state_for_s)}` + (d.phase ? ` · phase ${d.phase}` : '')));
      box.appendChild(h);
      if (d.reason) box.appendChild(el('p', {class: 'errors'}, 'failed: ' + d.reason));

      box.appendChild(el('h3', {}, 'Load and rates'));
      const L = d.load, R = d.rates;
      box.appendChild(table([
        ['messages in / handled / out', `${fmtRate(R.msgs_in_per_s)} / ${fmtRate(R.handled_per_s)} / ${fmtRate(R.msgs_out_per_s)}`],
        ['bytes in / out', `${fmtBytes(R.bytes_in_per_s)}/s / ${fmtBytes(R.bytes_out_per_s)}/s`],
        ['busy / idle / blocked (ms per s)', `${fmtNum(L.busy_ms_per_s, 0)} / ${fmtNum(L.idle_ms_per_s, 0)} / ${fmtNum(L.blocked_ms_per_s, 0)}`],
        ['mailbox depth', String(L.mailbox_depth)],
        ['outstanding requests (oldest)', `${L.outstanding} (${fmtSec(L.oldest_outstanding_s)})`],
        ['tokens/s', fmtNum(R.tokens_per_s)],
      ]));

      box.appendChild(el('h3', {}, 'Settings'));
      const st_ = table(d.settings.map((s) => [s.key, s.value + (s.from_default ? '  (default)' : '')]), ['key', 'value']);
      st_.classList.add('settings');
      box.appendChild(st_);

      box.appendChild(el('h3', {}, 'Counters'));
      const T = d.totals;
      const crow = [['messages in', T.msgs_in], ['messages out', T.msgs_out], ['handled', T.handled],
                    ['produced', T.produced], ['bytes in', fmtBytes(T.bytes_in)], ['bytes out', fmtBytes(T.bytes_out)],
                    ['busy s', T.busy_s], ['blocked s', T.blocked_s], ['waiting for input s', T.wait_s],
                    ['restarts', T.restarts], ['dropped', T.dropped]];
      if (d.policy_version != null) crow.push(['policy version', d.policy_version]);
      for (const [k, v] of Object.entries(d.counters || {})) crow.push([k, v]);
      for (const [k, v] of Object.entries(d.signals || {})) crow.push(['signal ' + k, v]);
      const ct = table(crow);
      ct.classList.add('counters');
      box.appendChild(ct);

      box.appendChild(el('h3', {}, 'Replicas'));
      box.appendChild(table(d.replicas_detail.map((r) => [
        String(r.replica), r.state.replace('_', ' ') + (r.phase ? ' · ' + r.phase : ''), r.msgs_in, r.msgs_out,
        fmtNum(r.busy_ms_per_s, 0), r.restarts]), ['#', 'state', 'in', 'out', 'busy ms/s', 'restarts']));

      const mem = d.replicas_detail.filter((r) => Object.keys(r.memory_bytes || {}).length);
      if (mem.length) {
        box.appendChild(el('h3', {}, 'Memory'));
        const cats = Object.keys(mem[0].memory_bytes);
        box.appendChild(table(mem.map((r) => [String(r.replica)].concat(cats.map((c) => fmtBytes(r.memory_bytes[c])))),
                              ['#'].concat(cats)));
      }

      box.appendChild(el('h3', {}, 'Recent errors'));
      const errs = el('ul', {class: 'errors'});
      for (const e of d.recent_errors) errs.appendChild(el('li', {}, `${fmtSec(e.t_s)} [${e.replica}] ${e.text}`));
      if (!d.recent_errors.length) errs.appendChild(el('li', {class: 'hint none'}, 'none'));
      box.appendChild(errs);

      box.appendChild(el('h3', {}, 'Edges'));
      box.appendChild(table(d.edges_in.map((e) => ['in', e]).concat(d.edges_out.map((e) => ['out', e]))));

      if (d.events.length) {
        box.appendChild(el('h3', {}, 'Events'));
        const ul = el('ul');
        for (const e of d.events.slice(-8)) ul.appendChild(el('li', {}, `${fmtSec(e.t_s)} ${e.kind}: ${e.text}`));
        box.appendChild(ul);
      }
    }).catch((e) => {
      $('detail').textContent = 'cannot load ' + name + ': ' + e.message;
    });
  }

  // -- bottlenecks, memory, charts, events -----------------------------------------------------
  function drawBottlenecks(list) {
    const ol = $('bottlenecks');
    ol.textContent = '';
    for (const b of list) {
      const li = el('li', {'data-node': b.name});
      const bar = el('span', {class: 'bar'});
      bar.style.width = Math.max(2, Math.round(b.score * 60)) + 'px';
      li.appendChild(bar);
      li.appendChild(el('b', {}, b.name));
      li.appendChild(document.createTextNode(' ' + b.state.replace('_', ' ')));
      li.appendChild(el('span', {class: 'why'}, b.why));
      li.addEventListener('click', () => select(b.name));
      ol.appendChild(li);
    }
  }

  // GET /api/cluster (and each frame's `cluster`): one row per process, lost nodes in red.
  function drawCluster(c) {
    const box = $('cluster');
    if (!c || !box) return;
    box.textContent = '';
    const t = el('table');
    const head = el('tr');
    for (const h of ['node', 'address', 'cpus', 'gpus', 'TLS', 'state', 'heartbeat', 'replicas']) head.appendChild(el('th', {}, h));
    t.appendChild(head);
    const rows = [Object.assign({address: '', tls: false, state: 'local', heartbeat_age_ms: null}, c.main)].concat(c.nodes || []);
    for (const n of rows) {
      const tr = el('tr', {class: n.state});
      const hb = n.state === 'local' ? '—' : (n.heartbeat_age_ms === null ? 'none yet' : n.heartbeat_age_ms + ' ms ago');
      const cells = [n.name, n.address || '—', String(n.cpus), String(n.gpus), n.state === 'local' ? '—' : (n.tls ? 'on' : 'off'),
        n.state + (n.lost_reason ? ': ' + n.lost_reason : ''), hb, (n.replicas || []).join(', ')];
      cells.forEach((v, i) => tr.appendChild(el('td', i === 6 ? {class: 'num'} : {}, v)));
      t.appendChild(tr);
    }
    box.appendChild(t);
    if (!c.clustered) box.appendChild(el('p', {class: 'hint'}, 'One process: every replica runs in main.'));
    else box.appendChild(el('p', {class: 'hint'}, 'heartbeat every ' + c.heartbeat_ms + ' ms, lost after ' + c.lost_after_ms + ' ms'));
  }

  function loadMemory() {
    api('/api/memory').then((m) => {
      const box = $('memory');
      box.textContent = '';
      if (!m.ranks.length) {
        box.appendChild(el('p', {class: 'hint'}, 'No node reports its memory. Process RSS ' + fmtBytes(m.rss_bytes) + '.'));
        return;
      }
      const cats = [];
      for (const r of m.ranks) for (const c of Object.keys(r.bytes)) if (!cats.includes(c)) cats.push(c);
      const t = el('table');
      const tr = el('tr');
      for (const h of ['rank'].concat(cats, ['total'])) tr.appendChild(el('th', {}, h));
      t.appendChild(tr);
      for (const r of m.ranks) {
        const row = el('tr');
        row.appendChild(el('td', {}, r.rank));
        for (const c of cats) row.appendChild(el('td', {}, fmtBytes(r.bytes[c])));
        row.appendChild(el('td', {}, fmtBytes(r.total_bytes)));
        t.appendChild(row);
      }
      box.appendChild(t);
      box.appendChild(el('p', {class: 'hint'}, 'process RSS ' + fmtBytes(m.rss_bytes)));
    }).catch(() => {});
  }

  function addPoint(node, name, t, v) {
    if (v === null || v === undefined) return;
    const key = (node ? node + '/' : '') + name;
    const s = st.series[key] = st.series[key] || {node, name, points: []};
    const last = s.points[s.points.length - 1];
    if (last && t <= last[0]) return;  // already have it (history, then the stream)
    s.points.push([t, v]);
    if (s.points.length > 2000) s.points.shift();
  }

  function addPhase(t, node, phase) {
    const last = st.phases[st.phases.length - 1];
    if (last && t < last.t_s) return;
    if (last && t === last.t_s && last.node === node && last.phase === phase) return;
    st.phases.push({t_s: t, node, phase});
  }

  function drawCharts() {
    const box = $('charts');
    const keys = Object.keys(st.series).sort((a, b) => (a.startsWith('tokens') ? -1 : 0) - (b.startsWith('tokens') ? -1 : 0) || a.localeCompare(b));
    box.textContent = '';
    const W = 260, H = 90;
    for (const k of keys) {
      const s = st.series[k];
      if (!s.points.length) continue;
      const div = el('div', {class: 'chart', 'data-series': k});
      const latest = s.points[s.points.length - 1][1];
      const head = el('div', {class: 'title'}, k.replace(/^\//, ''));
      head.appendChild(el('span', {class: 'latest'}, fmtNum(latest, 4)));
      div.appendChild(head);
      const svg = el('svg:svg', {width: W, height: H, viewBox: `0 0 ${W} ${H}`});
      const ts = s.points.map((p) => p[0]), vs = s.points.map((p) => p[1]);
      const t0 = Math.min(...ts), t1 = Math.max(...ts);
      let v0 = Math.min(...vs), v1 = Math.max(...vs);
      if (v0 === v1) { v0 -= Math.abs(v0) * 0.05 + 1e-9; v1 += Math.abs(v1) * 0.05 + 1e-9; }
      const X = (t) => 30 + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - 36);
      const Y = (v) => 8 + (1 - (v - v0) / (v1 - v0)) * (H - 24);
      svg.appendChild(el('svg:line', {class: 'axis', x1: 30, y1: H - 16, x2: W - 4, y2: H - 16}));
      svg.appendChild(el('svg:line', {class: 'axis', x1: 30, y1: 6, x2: 30, y2: H - 16}));
      svg.appendChild(el('svg:text', {x: 2, y: 14}, fmtNum(v1, 3)));
      svg.appendChild(el('svg:text', {x: 2, y: H - 18}, fmtNum(v0, 3)));
      svg.appendChild(el('svg:text', {x: 30, y: H - 3}, fmtNum(t0) + ' s'));
      svg.appendChild(el('svg:text', {x: W - 4, y: H - 3, 'text-anchor': 'end'}, fmtNum(t1) + ' s'));
      svg.appendChild(el('svg:polyline', {points: s.points.map((p) => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' ')}));
      div.appendChild(svg);
      box.appendChild(div);
    }
    if (!box.children.length) box.appendChild(el('p', {class: 'hint'}, 'No signals yet (nodes report them with ctx.signal).'));
    const ph = $('phases');
    ph.textContent = '';
    const recent = st.phases.slice(-12);
    recent.forEach((p, i) => {
      ph.appendChild(el('span', {class: i === recent.length - 1 ? 'current' : ''}, `${fmtSec(p.t_s)} ${p.node}: ${p.phase}`));
    });
  }

  function addEvents(list) {
    const ul = $('events');
    for (const e of list) {
      if (e.seq <= st.lastEventSeq) continue;  // already shown
      st.lastEventSeq = e.seq;
      st.events.push(e);
      const li = el('li', {'data-kind': e.kind});
      li.appendChild(el('span', {class: 't'}, fmtSec(e.t_s)));
      li.appendChild(el('span', {class: 'kind kind-' + e.kind}, e.kind));
      const who = e.node ? e.node + (e.replica >= 0 ? '[' + e.replica + '] ' : ' ') : '';
      li.appendChild(document.createTextNode(who + e.text));
      ul.insertBefore(li, ul.firstChild);
    }
    while (ul.children.length > 300) ul.removeChild(ul.lastChild);
  }

  // -- frames ------------------------------------------------------------------------------------
  let chartsDirty = true;
  function onFrame(f) {
    const s = f.status;
    $('graph-name').textContent = s.graph;
    const rs = $('run-state');
    rs.textContent = s.run_state + (s.finished ? ` (exit ${s.exit_code})` : '');
    rs.className = 'badge ' + s.run_state;
    // asynchronous RLHF: the staleness of the last trained batch and the stale batches so far
    const a = s.async;
    $('phase').textContent = (s.phase || '') + (a && a.staleness != null
        ? ` · staleness ${a.staleness} (dropped ${a.stale_dropped}, waited ${a.stale_waited})` : '');
    $('elapsed').textContent = fmtNum(s.elapsed_s, 1);
    // the phases under way as step k/N with an ETA (node_context::progress); else the largest step counter
    $('steps').textContent = s.progress_text ? s.progress_text : 'step ' + s.steps + (s.total_steps > 0 ? '/' + s.total_steps : '');
    $('tps').textContent = fmtNum(s.tokens_per_s);
    $('rss').textContent = fmtBytes(s.rss_bytes);
    const running = !s.finished && s.run_state !== 'stopping';
    $('btn-pause').disabled = !running || s.run_state === 'paused';
    $('btn-resume').disabled = !running || s.run_state !== 'paused';
    $('btn-stop').disabled = !running;
    $('btn-checkpoint').disabled = !running;
    if (s.error) message('error: ' + s.error, 'err');
    for (const n of f.nodes) st.nodes[n.name] = n;
    for (const e of f.edges) st.edges[e.name] = e;
    update();
    drawBottlenecks(f.bottlenecks || []);
    for (const p of f.signals || []) {
      if (p.name === 'phase') addPhase(p.t_s, p.node, p.text);
      else addPoint(p.node, p.name, p.t_s, p.value);
      chartsDirty = true;
    }
    if (f.tokens_per_s_point) { addPoint('', 'tokens_per_s', f.tokens_per_s_point[0], f.tokens_per_s_point[1]); chartsDirty = true; }
    if (st.phases.length > 500) st.phases.splice(0, st.phases.length - 500);
    addEvents(f.events || []);
    drawCluster(f.cluster);
    if (st.selected && Date.now() - st.lastDetail > 1500) loadDetail();
  }

  function connect() {
    const es = new EventSource('/api/stream' + tokenQuery());
    es.addEventListener('open', () => { $('conn').className = 'conn live'; });
    es.addEventListener('frame', (ev) => {
      $('conn').className = 'conn live';
      try { onFrame(JSON.parse(ev.data)); } catch (e) { console.error(e); }
    });
    es.addEventListener('end', (ev) => {
      st.finished = true;
      es.close();
      $('conn').className = 'conn';
      try {
        const s = JSON.parse(ev.data);
        $('run-state').textContent = 'finished (exit ' + s.exit_code + ')';
        $('run-state').className = 'badge finished';
        message('The run ended' + (s.error ? ': ' + s.error : '') + '. This page shows its last state.', s.error ? 'err' : 'ok');
      } catch (e) { /* keep the last frame */ }
      for (const b of ['pause', 'resume', 'stop', 'checkpoint']) $('btn-' + b).disabled = true;
    });
    es.addEventListener('error', () => {
      $('conn').className = 'conn lost';
      if (st.finished) es.close();
    });
  }

  // -- start ---------------------------------------------------------------------------------------
  api('/api/graph').then((g) => {
    st.graph = g;
    $('graph-name').textContent = g.name;
    document.title = 'flowrun · ' + g.name;
    drawGraph();
    return api('/api/signals');
  }).then((sig) => {
    for (const s of sig.series) for (const [t, v] of s.points) addPoint(s.node, s.name, t, v);
    for (const p of sig.phases) addPhase(p.t_s, p.node, p.phase);
    return api('/api/events');
  }).then((ev) => {
    addEvents(ev.events);
    connect();
  }).catch((e) => {
    message('cannot reach the console API: ' + e.message, 'err');
    $('conn').className = 'conn lost';
  });
  setInterval(() => { if (chartsDirty) { chartsDirty = false; drawCharts(); } }, 1000);
  setInterval(() => { if (!st.finished) loadMemory(); }, 3000);
  loadMemory();
  api('/api/cluster').then(drawCluster).catch(() => {});
})();
