// A stand-in for an LLM provider: a deterministic answer to a prompt, streamed as deltas with
// a delay, that can fail mid-stream the way real providers do (HTTP 529 "overloaded") and can
// continue an answer from a prefix (what a resumed producer asks for under plan R1).
const WORDS = `the a durable stream survives crashes refreshes and restarts because every delta is
  written before it is shown holdfast numbers each event so a browser that comes back asks for
  what it has not seen and never gets an answer twice agents keep credentials run logs and
  checkpoints beside their streams`.split(/\s+/).filter(Boolean);

/** The answer's deltas for `prompt`: `count` pieces, each a word and a separator. */
export function fakeReply(prompt, count = 300) {
  let h = 2166136261;
  for (const ch of String(prompt)) h = Math.imul(h ^ ch.codePointAt(0), 16777619) >>> 0;
  // 60 characters, not UTF-16 units: `slice(0, 60)` could cut an emoji in half.
  const pieces = [`Answer to "${Array.from(String(prompt)).slice(0, 60).join('')}": `];
  for (let i = 1; i < count; i++) {
    h = Math.imul(h ^ i, 16777619) >>> 0;
    const word = WORDS[h % WORDS.length];
    pieces.push(i === count - 1 ? `${word}. [end of answer ${count}]` : `${word}${i % 12 === 11 ? '. ' : ' '}`);
  }
  return pieces;
}

export class ProviderError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Stream the answer as deltas from character `from` (a continuation starts where the prefix
 * ends). `failAt`: on a first attempt (from 0), throw a 529 after that many deltas.
 */
export async function* fakeStream(prompt, { deltas = 300, delayMs = 10, failAt = null, from = 0 } = {}) {
  const pieces = fakeReply(prompt, deltas);
  let pos = 0;
  let sent = 0;
  for (const piece of pieces) {
    const end = pos + piece.length;
    if (end > from) {
      if (failAt !== null && from === 0 && sent === failAt) throw new ProviderError(529, 'Overloaded');
      if (delayMs > 0) await sleep(delayMs);
      yield pos >= from ? piece : piece.slice(from - pos);
      sent += 1;
    }
    pos = end;
  }
}
