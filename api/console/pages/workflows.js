// Workflows: the list, newest first, filtered by state, tenant and type, a page at a time (keyset paging).

import { api, problem } from '../api.js';
import { add, badge, h, link, notice, table, time } from '../dom.js';
import { workflowLink } from './attention.js';

const STATES = ['running', 'compensating', 'completed', 'failed', 'compensation_failed', 'cancelled'];

export async function render(target, ctx) {
  const params = ctx.params;
  const state = h('select', { name: 'state', id: 'state' }, h('option', { value: '' }, 'any state'),
    STATES.map((s) => h('option', { value: s, selected: params.get('state') === s }, s)));
  const name = h('input', { name: 'name', id: 'name', value: params.get('name') ?? '', placeholder: 'payment' });
  const tenant = ctx.me.role === 'operator'
    ? h('input', { name: 'tenant', id: 'tenant', value: params.get('tenant') ?? '', placeholder: 'every tenant' }) : null;
  const form = h('form', { class: 'inline', on: { submit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    if (state.value) q.set('state', state.value);
    if (name.value.trim()) q.set('name', name.value.trim());
    if (tenant && tenant.value.trim()) q.set('tenant', tenant.value.trim());
    location.hash = `#/workflows?${q}`;
  } } }, h('label', { for: 'state' }, 'State', state), h('label', { for: 'name' }, 'Type', name),
  tenant ? h('label', { for: 'tenant' }, 'Tenant', tenant) : null, h('button', { class: 'primary', type: 'submit' }, 'Show'));
  add(target, h('h1', {}, 'Workflows'), h('div', { class: 'panel' }, form));

  const query = new URLSearchParams({ limit: '50' });
  for (const key of ['state', 'name', 'tenant', 'cursor']) if (params.get(key)) query.set(key, params.get(key));
  const answer = await api('GET', `/v1/workflows?${query}`);
  if (!ctx.current()) return;
  if (!answer.ok) { add(target, notice(problem(answer), true)); return; }
  const list = answer.data.workflows;
  const rows = list.map((w) => [time(w.created_at), workflowLink(w), w.name, w.input?.tenant ?? '—', badge(w.state), time(w.updated_at)]);
  const filters = Object.fromEntries([...params].filter(([k]) => k !== 'cursor'));
  const pager = h('div', { class: 'pager' },
    params.get('cursor') ? link(['workflows'], '« Newest', filters) : null,
    answer.data.next_cursor ? link(['workflows'], 'Older »', { ...filters, cursor: answer.data.next_cursor }) : null);
  add(target, h('section', { class: 'panel', id: 'workflows' },
    rows.length ? table(['Created', 'Workflow', 'Type', 'Tenant', 'State', 'Updated'], rows) : h('p', { class: 'muted' }, 'None.'), pager));
}
