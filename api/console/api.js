// The console's only way out: the API of the server that served it (same origin, no cookies), with the key kept
// for this browser tab only.

const KEY = 'onceflow.key';

export const session = {
  key: () => sessionStorage.getItem(KEY),
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

/** Calls the API: `{status, ok, data, text}`; the path must be one of this server's (never another origin). */
export async function api(method, path, body) {
  if (!(path.startsWith('/v1/') || path === '/openapi.json')) throw new Error(`not an API path: ${path}`);
  const headers = { Accept: 'application/json' };
  const key = session.key();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers, credentials: 'omit', cache: 'no-store', redirect: 'error', mode: 'same-origin' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    return { status: 0, ok: false, data: null, text: `the server did not answer (${e.message})` };
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  return { status: response.status, ok: response.ok, data, text };
}

/** A problem's words, or the status. */
export function problem(answer) {
  if (answer.data && answer.data.code) return `${answer.status} ${answer.data.code}: ${answer.data.detail ?? ''}`;
  return answer.status ? `HTTP ${answer.status}` : answer.text;
}

let paths;

/** Whether the server has the route (from its OpenAPI document): parts of the console whose route is not there
 * (yet) are not shown. */
export async function has(method, path) {
  if (!paths) {
    const doc = await api('GET', '/openapi.json');
    paths = doc.ok && doc.data ? doc.data.paths ?? {} : {};
  }
  return Boolean(paths[path] && paths[path][method.toLowerCase()]);
}

/** `parts` as a path under `/v1/`, each part encoded. */
export function path(...parts) {
  return '/v1/' + parts.map((p) => encodeURIComponent(p)).join('/');
}
