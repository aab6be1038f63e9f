// The page: history from the server (committed answers from holdfast), live runs over SSE.
// Each run has one element, keyed by run id; text only ever goes into that element, and a
// `final` event replaces it: so an answer can appear only once, whatever reconnects.
const params = new URLSearchParams(location.search);
const thread = params.get('thread') || 'demo';
// Knobs for trying failures (and for the tests): ?deltas=300&delayMs=15&failAt=120
const knobs = {};
for (const k of ['deltas', 'delayMs', 'failAt']) if (params.has(k)) knobs[k] = Number(params.get(k));

const list = document.getElementById('messages');
// What this page load received, for anyone checking (the browser tests do).
const stats = window.holdfastStats = {
  textEvents: 0, finals: 0, finishes: 0, resets: 0, interrupts: 0, reconnects: 0, opened: 0, errors: 0, gaveUp: 0,
};

// The page follows the answer down as it grows — unless the reader scrolled up to read.
let pinned = true;
const atBottom = () => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 40;
window.addEventListener('scroll', () => { pinned = atBottom(); }, { passive: true });
function grew() {
  if (pinned) window.scrollTo(0, document.documentElement.scrollHeight);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function addUser(text) {
  list.append(el('div', 'msg user', text));
  pinned = true; // a new message: follow it
  grew();
}

function addAssistant(runId) {
  const box = el('div', 'msg assistant');
  box.dataset.run = runId;
  const body = el('div', 'text');
  const tools = el('div', 'tools');
  const meta = el('div', 'meta');
  const badge = el('span', 'badge');
  const note = el('span', 'note');
  meta.append(badge, note);
  box.append(body, tools, meta);
  list.append(box);
  grew();
  return {
    box, body, tools, badge, note,
    status(s, text) {
      box.dataset.status = s;
      badge.className = `badge ${s}`;
      badge.textContent = text ?? s;
    },
  };
}

function follow(runId, view) {
  view.status('streaming');
  let lastSeq = 0;
  let es = null;
  const calls = new Map();
  const open = () => {
    stats.opened += 1;
    // After a failed connection the page reopens it itself, saying where it was.
    es = new EventSource(`/api/runs/${encodeURIComponent(runId)}/events${lastSeq ? `?lastEventId=${lastSeq}` : ''}`);
    const seen = (e) => { lastSeq = Number(e.lastEventId) || lastSeq; return JSON.parse(e.data); };
    es.addEventListener('text', (e) => {
      const ev = seen(e);
      stats.textEvents += 1;
      view.body.textContent += ev.text;
      grew();
    });
    es.addEventListener('tool_call_delta', (e) => {
      const ev = seen(e);
      let c = calls.get(ev.id);
      if (!c) {
        c = el('div', 'tool');
        c.dataset.name = ev.name || '';
        calls.set(ev.id, c);
        view.tools.append(c);
      }
      c.textContent = `${c.dataset.name}(${(c.dataset.args = (c.dataset.args || '') + (ev.arguments_delta || ''))})`;
    });
    es.addEventListener('tool_call_end', (e) => { seen(e); });
    es.addEventListener('tool_call_cancel', (e) => {
      const ev = seen(e);
      calls.get(ev.id)?.classList.add('cancelled');
    });
    es.addEventListener('stream_reset', (e) => {
      seen(e);
      stats.resets += 1;
      view.body.textContent = '';
      view.tools.textContent = '';
      calls.clear();
    });
    es.addEventListener('interrupted', (e) => {
      const ev = seen(e);
      stats.interrupts += 1;
      view.status('interrupted', `recovering (${ev.plan})`);
      view.note.textContent = `the model's stream broke (${ev.cause}); resuming`;
    });
    es.addEventListener('finish', (e) => {
      const ev = seen(e);
      stats.finishes += 1;
      es.close();
      end(ev);
    });
    es.addEventListener('final', (e) => {
      const ev = seen(e);
      stats.finals += 1;
      es.close();
      end(ev);
    });
    es.onerror = (e) => {
      if (e.data) {
        // The server's `error` event (its daemon unreachable or refusing): it ends the
        // response, and EventSource reconnects by itself after `retry`.
        stats.errors += 1;
        view.note.textContent = `the server could not follow this answer: ${JSON.parse(e.data).message}; retrying`;
        return;
      }
      stats.reconnects += 1;
      if (es.readyState === EventSource.CLOSED) {
        // An HTTP error: the server restarting (retry), or no such run (a 404: it may not have
        // begun yet; ask whether it ever will).
        es.close();
        retry();
      } // else it reconnects by itself, with Last-Event-ID
    };
  };
  const retry = async () => {
    let info = null;
    try {
      const r = await fetch(`/api/runs/${encodeURIComponent(runId)}`);
      if (r.status === 404) info = await r.json();
    } catch {
      // the server is down: try again
    }
    if (info?.gave_up) {
      stats.gaveUp += 1;
      view.status('failed');
      view.note.textContent = info.error || 'the answer never started';
      return;
    }
    setTimeout(open, 1000);
  };
  const end = (ev) => {
    if (ev.status === 'committed') {
      // The stored final message is the truth: it replaces whatever this page built.
      if (ev.final_message && typeof ev.final_message.content === 'string') {
        view.body.textContent = ev.final_message.content;
      }
      view.status('done');
      view.note.textContent = '';
      grew();
    } else {
      view.status('aborted', ev.status);
    }
  };
  open();
}

async function load() {
  const r = await fetch(`/api/threads/${encodeURIComponent(thread)}`);
  const body = await r.json();
  if (!r.ok) {
    // The daemon's reason, e.g. "... run `holdfast init`".
    list.append(el('div', 'msg assistant', `error: ${body.error}`));
    document.body.dataset.loaded = 'true';
    return;
  }
  const { messages } = body;
  for (const m of messages) {
    if (m.role === 'user') {
      addUser(m.text);
      continue;
    }
    const view = addAssistant(m.run_id);
    if (m.status === 'committed') {
      view.body.textContent = m.text;
      view.status('done');
    } else if (m.status === 'aborted' || m.status === 'expired' || m.status === 'abandoned') {
      view.status('aborted', m.status);
    } else if (m.status === 'failed') {
      view.status('failed');
      view.note.textContent = m.error;
    } else {
      follow(m.run_id, view); // streaming, interrupted, or not begun yet
    }
  }
  document.body.dataset.loaded = 'true';
  grew();
}

document.getElementById('send').addEventListener('submit', async (e) => {
  e.preventDefault();
  const input = document.getElementById('text');
  const text = input.value.trim();
  if (!text) return;
  input.value = '';
  addUser(text);
  let r;
  let body;
  try {
    r = await fetch(`/api/threads/${encodeURIComponent(thread)}/messages`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ text, ...knobs }),
    });
    body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  } catch (err) {
    // The request never got an answer (the server stopped under it): say so, never nothing.
    body = { error: `the message was not sent (${err.message}); send it again` };
  }
  if (!r?.ok) {
    const failed = el('div', 'msg assistant', `error: ${body.error}`);
    failed.dataset.status = 'failed';
    list.append(failed);
    grew();
    return;
  }
  follow(body.run_id, addAssistant(body.run_id));
});

load();
