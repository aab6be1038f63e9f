// A reader of text/event-stream responses for the tests, by the WHATWG rules (fields id, event,
// data, retry; comments; a blank line dispatches), over Node's http.
import http from 'node:http';

export function parseSse() {
  let buf = '';
  let cur = { data: [], event: 'message', id: undefined };
  const parser = {
    events: [], comments: [], retry: null, lastId: '',
    feed(text) {
      buf += text;
      let nl;
      while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
        if (line === '') {
          if (cur.id !== undefined) parser.lastId = cur.id;
          if (cur.data.length) {
            parser.events.push({ event: cur.event, data: cur.data.join('\n'), id: parser.lastId });
          }
          cur = { data: [], event: 'message', id: undefined };
          continue;
        }
        if (line.startsWith(':')) {
          parser.comments.push(line.slice(1).trim());
          continue;
        }
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
        if (field === 'data') cur.data.push(value);
        else if (field === 'event') cur.event = value;
        else if (field === 'id') cur.id = value;
        else if (field === 'retry' && /^\d+$/.test(value)) parser.retry = Number(value);
      }
    },
  };
  return parser;
}

/** GET `url` and read its SSE until `until(parser)` is true (then the request is dropped, as
 * a browser tab closing does) or the response ends. */
export function readSse(url, { headers = {}, until = () => false, timeoutMs = 20_000 } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { headers }, (res) => {
      const parser = parseSse();
      let done = false;
      const finish = (ended) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve({ status: res.statusCode, headers: res.headers, ended, ...pick(parser) });
      };
      res.setEncoding('utf8');
      res.on('data', (text) => {
        parser.feed(text);
        if (!done && until(parser)) {
          finish(false);
          req.destroy();
        }
      });
      res.on('end', () => finish(true));
      res.on('error', () => finish(false));
      res.on('close', () => finish(false));
    });
    const timer = setTimeout(() => {
      req.destroy();
      reject(new Error(`no end of ${url} within ${timeoutMs} ms`));
    }, timeoutMs);
    req.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
}

function pick(p) {
  return { events: p.events, comments: p.comments, retry: p.retry, lastId: p.lastId };
}
