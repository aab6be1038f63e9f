// Finding the daemon's socket, as the `holdfast` CLI finds it.
import { readFileSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';

function envPath(name) {
  const v = process.env[name];
  return v && isAbsolute(v) ? v : null;
}

function expandHome(p) {
  const home = envPath('HOME');
  if (home && (p === '~' || p.startsWith('~/'))) return p === '~' ? home : join(home, p.slice(2));
  return p;
}

function configPath() {
  if (process.env.HOLDFAST_CONFIG) return process.env.HOLDFAST_CONFIG;
  const cfg = envPath('XDG_CONFIG_HOME');
  if (cfg) return join(cfg, 'holdfast', 'config.toml');
  const home = envPath('HOME');
  return home ? join(home, '.config', 'holdfast', 'config.toml') : null;
}

const TOP_SOCKET = /^\s*socket\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')\s*(?:#.*)?$/;

/** The top-level `socket` key of the config file, or null. Top-level keys come before the
 * first table; a basic string's escapes are JSON's for the characters a path holds. */
export function socketFromConfig(path) {
  let text;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return null;
  }
  for (const line of text.split(/\r?\n/)) {
    if (line.trimStart().startsWith('[')) break;
    const m = TOP_SOCKET.exec(line);
    if (!m) continue;
    let value = m[2];
    if (m[1] !== undefined) {
      try {
        value = JSON.parse(`"${m[1]}"`);
      } catch {
        return null; // a broken config: the daemon refuses it too; fall back to the default
      }
    }
    return value ? expandHome(value) : null;
  }
  return null;
}

/**
 * The daemon's socket: `$HOLDFAST_SOCKET`, then the config file's `socket` (`$HOLDFAST_CONFIG`,
 * else `$XDG_CONFIG_HOME/holdfast/config.toml`, else `~/.config/holdfast/config.toml`), then
 * `$XDG_RUNTIME_DIR/holdfast/holdfast.sock`, else `/tmp/holdfast-$UID/holdfast.sock`.
 */
export function defaultSocketPath() {
  if (process.env.HOLDFAST_SOCKET) return process.env.HOLDFAST_SOCKET;
  const cfg = configPath();
  const fromCfg = cfg ? socketFromConfig(cfg) : null;
  if (fromCfg) return fromCfg;
  const runtime = envPath('XDG_RUNTIME_DIR');
  if (runtime) return join(runtime, 'holdfast', 'holdfast.sock');
  return `/tmp/holdfast-${process.geteuid()}/holdfast.sock`;
}
