// Building the page from data as text, never as markup: every string reaches the page as a text node or an
// attribute value, so an order number like `<img src=x onerror=alert(1)>` reads as those characters.

const FORBIDDEN = /^(on|style$|src$|srcdoc$|formaction$)/i;

/** An element `tag` with attributes (`on`: event listeners; `href`: internal `#…` links only) and children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'on') {
      for (const [event, handler] of Object.entries(value)) el.addEventListener(event, handler);
      continue;
    }
    if (FORBIDDEN.test(name)) throw new Error(`attribute ${name} is not set from data`);
    if (name === 'href' && !String(value).startsWith('#')) throw new Error('links stay inside the console');
    el.setAttribute(name, value === true ? '' : String(value));
  }
  add(el, children);
  return el;
}

/** Appends children (nodes, or anything else as text). */
export function add(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** A link to the console page `hash` (its parts encoded). */
export function link(parts, text, query) {
  const path = '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
  const q = query ? '?' + new URLSearchParams(query).toString() : '';
  return h('a', { href: path + q }, text);
}

/** A time in the browser's zone, with its UTC value on hover. */
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return h('span', {}, iso);
  const utc = d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, '') + ' UTC';
  const local = d.toLocaleString(undefined, {
    year: 'numeric', month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit',
  });
  return h('time', { datetime: iso, title: utc }, local);
}

/** An age in seconds, in words. */
export function age(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** An amount in minor units, with its currency (the minor units on hover). */
export function money(amount, currency) {
  if (typeof amount !== 'number') return h('span', { class: 'muted' }, '—');
  try {
    const format = new Intl.NumberFormat(undefined, { style: 'currency', currency, currencyDisplay: 'code' });
    const digits = format.resolvedOptions().maximumFractionDigits;
    return h('span', { title: `${amount} minor units` }, format.format(amount / 10 ** digits));
  } catch {
    return h('span', {}, `${amount} ${currency ?? ''} (minor units)`);
  }
}

const STATE_CLASS = {
  succeeded: 'ok', completed: 'ok', paid: 'ok', done: 'ok', complete: 'ok', matched: 'ok',
  processing: 'warn', running: 'info', compensating: 'warn', paying: 'warn', started: 'info', retrying: 'warn',
  unknown: 'warn', registered: 'plain', pending: 'plain', partial: 'warn', cancelled: 'plain', refunded: 'plain',
  failed: 'bad', declined: 'bad', compensation_failed: 'bad',
};

/** A state as a coloured badge. */
export function badge(state) {
  const text = String(state ?? '—');
  return h('span', { class: `badge ${STATE_CLASS[text] ?? ''}`.trim() }, text);
}

/** A JSON value, pretty-printed as text, with idempotency tokens masked. */
export function json(value) {
  return h('pre', { class: 'json' }, JSON.stringify(mask(value), null, 2));
}

/** `value` with every idempotency token masked: a `token` field, and any `tok_…` string. */
export function mask(value, key) {
  if (typeof value === 'string') {
    if (key === 'token' || key === 'Idempotency-Key') return value.length > 6 ? `…${value.slice(-4)}` : '***';
    return value.replace(/tok_[0-9a-f]{12,}/g, (t) => `tok_…${t.slice(-4)}`);
  }
  if (Array.isArray(value)) return value.map((v) => mask(v));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, mask(v, k)]));
  }
  return value;
}

/** A definition list of `[label, value]` pairs (values absent are left out). */
export function facts(pairs) {
  const dl = h('dl', { class: 'facts' });
  for (const [label, value] of pairs) {
    if (value === undefined || value === null || value === '') continue;
    add(dl, h('dt', {}, label), h('dd', {}, value));
  }
  return dl;
}

/** A table of `rows` (arrays of cells) under `headings`. */
export function table(headings, rows) {
  return h('table', {},
    h('thead', {}, h('tr', {}, headings.map((t) => h('th', {}, t)))),
    h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map((c) => h('td', {}, c))))));
}

/** A notice (an error when `bad`). */
export function notice(text, bad) {
  return h('div', { class: bad ? 'notice bad' : 'notice', role: bad ? 'alert' : 'status' }, text);
}
