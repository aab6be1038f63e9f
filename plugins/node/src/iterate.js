// How the plugin reads a provider's stream: a web ReadableStream (a `fetch` body, an AI SDK
// stream) through its own reader, so that letting it go cancels it even while a read is pending
// (its async iterator's return() waits behind that read, and a locked stream cannot be
// cancelled); anything else through its async or sync iterator.

/** An iterator over `source`, whose `return()` lets it go (a web stream is cancelled), or
 * null if it is not iterable. */
export function iterate(source) {
  if (source && typeof source.getReader === 'function' && source.locked === false) {
    const reader = source.getReader();
    return {
      next: () => reader.read(),
      return: async () => {
        try { await reader.cancel(); } catch { /* let go: nothing to report */ }
        return { done: true, value: undefined };
      },
    };
  }
  return source?.[Symbol.asyncIterator]?.() ?? source?.[Symbol.iterator]?.() ?? null;
}
