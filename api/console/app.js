// The console's frame: signing in, the navigation, and the page the address names (`#/page/part?query`).

import { api, has, problem, session } from './api.js';
import { add, h, notice } from './dom.js';
import * as attention from './pages/attention.js';
import * as find from './pages/find.js';
import * as payment from './pages/payment.js';
import * as workflows from './pages/workflows.js';
import * as reconciliation from './pages/reconciliation.js';

const PAGES = {
  '': attention, find, payment, workflow: payment, workflows, reconciliation,
};

const main = document.getElementById('main');
let me = null;
/** Increased on every navigation: a page still loading for an older address stops drawing. */
let generation = 0;

function parse() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [route, query = ''] = raw.split('?');
  const parts = route.split('/').filter(Boolean).map((p) => decodeURIComponent(p));
  return { page: parts[0] ?? '', parts: parts.slice(1), params: new URLSearchParams(query) };
}

/** Draws the page the address names. A refresh (`refreshing`) draws it aside and puts it in place once whole,
 * keeping the scroll position and the open details: the page never blanks nor jumps while it is read. */
async function show(refreshing = false) {
  const mine = ++generation;
  const where = parse();
  const page = PAGES[where.page] ?? attention;
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('current', a.dataset.page === (PAGES[where.page] ? where.page : ''));
  }
  const target = h('div');
  if (!refreshing) main.replaceChildren(target);
  const ctx = {
    me,
    ...where,
    page: where.page,
    current: () => mine === generation,
    refresh: () => show(true),
  };
  try {
    await page.render(target, ctx);
  } catch (e) {
    if (mine === generation) target.replaceChildren(notice(`This page could not be shown: ${e.message}`, true));
  }
  if (refreshing && mine === generation) {
    const y = window.scrollY;
    const open = [...main.querySelectorAll('details')].map((d) => d.open);
    main.replaceChildren(target);
    [...main.querySelectorAll('details')].forEach((d, i) => { if (open[i]) d.open = true; });
    window.scrollTo(0, y);
  }
}

function signInForm(message) {
  // A text field, not a password one: the browser is not to offer to keep the key (it is kept for this tab only).
  const key = h('input', { type: 'text', name: 'key', autocomplete: 'off', autocapitalize: 'off', spellcheck: 'false', required: true, id: 'key', class: 'secret' });
  const form = h('form', { on: { submit: (e) => { e.preventDefault(); session.set(key.value.trim()); start(); } } },
    h('label', { for: 'key' }, 'API key (operator or tenant)', key),
    h('button', { class: 'primary', type: 'submit', id: 'sign-in' }, 'Sign in'));
  main.replaceChildren(h('div', { class: 'panel signin' },
    h('h1', {}, 'Sign in'),
    message ? notice(message, true) : null,
    h('p', { class: 'muted' }, 'The key is kept for this browser tab only, and sent to this server only.'),
    form));
  document.getElementById('nav').replaceChildren();
  document.getElementById('who').replaceChildren();
  key.focus();
}

async function chrome() {
  const nav = document.getElementById('nav');
  const items = [['', 'Attention'], ['find', 'Find'], ['workflows', 'Workflows']];
  if (me.operator && (await has('get', '/v1/reconciliations'))) items.push(['reconciliation', 'Reconciliation']);
  nav.replaceChildren(...items.map(([page, text]) => {
    const a = h('a', { href: `#/${page}` }, text);
    a.dataset.page = page;
    return a;
  }));
  const who = document.getElementById('who');
  const role = me.role === 'local' ? 'no keys configured' : me.role;
  who.replaceChildren(h('span', { id: 'whoami' }, `${me.name} · ${role}`));
  if (me.role !== 'local') {
    add(who, h('button', { type: 'button', id: 'sign-out', on: { click: () => { session.clear(); me = null; signInForm(); } } }, 'Sign out'));
  }
}

async function start() {
  const answer = await api('GET', '/v1/whoami');
  if (answer.status === 401) {
    const hadKey = Boolean(session.key());
    session.clear();
    signInForm(hadKey ? 'That key was not accepted.' : null);
    return;
  }
  if (!answer.ok) {
    main.replaceChildren(notice(`The server answered ${problem(answer)}.`, true));
    return;
  }
  me = answer.data;
  await chrome();
  await show();
}

window.addEventListener('hashchange', () => { if (me) show(); });
start();
