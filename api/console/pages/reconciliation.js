// Reconciliation: a day's counts per class and its exceptions, per tenant.

import { api, has, problem } from '../api.js';
import { add, badge, h, json, notice, table, time } from '../dom.js';

export async function render(target, ctx) {
  add(target, h('h1', {}, 'Reconciliation'));
  if (!(await has('get', '/v1/reconciliations'))) {
    add(target, notice('This server does not reconcile yet.'));
    return;
  }
  const date = ctx.params.get('date') ?? new Date(Date.now() - 86400000).toISOString().slice(0, 10);
  const input = h('input', { type: 'date', id: 'date', name: 'date', value: date });
  add(target, h('div', { class: 'panel' }, h('form', { class: 'inline', on: { submit: (e) => {
    e.preventDefault();
    location.hash = `#/reconciliation?${new URLSearchParams({ date: input.value })}`;
  } } }, h('label', { for: 'date' }, 'Day (UTC)', input), h('button', { class: 'primary', type: 'submit' }, 'Show'))));
  const answer = await api('GET', `/v1/reconciliations?${new URLSearchParams({ date })}`);
  if (!ctx.current()) return;
  if (answer.status === 404 && answer.data?.code === 'reconciliation_not_found') {
    add(target, notice(`${date} is not reconciled yet.`));
    return;
  }
  if (!answer.ok) { add(target, notice(problem(answer), true)); return; }
  for (const r of answer.data.reconciliations ?? []) {
    const counts = Object.entries(r.counts ?? {});
    add(target, h('section', { class: 'panel' },
      h('h2', {}, `${r.tenant} · ${r.date} `, badge(r.state), h('span', { class: 'muted' }, 'ran ', time(r.ran_at))),
      table(counts.map(([k]) => k), [counts.map(([, v]) => String(v))]),
      (r.exceptions ?? []).length
        ? table(['Class', 'Kind', 'Number', 'Ours', 'Channel', 'Action'], r.exceptions.map((x) => [badge(x.class), x.kind, h('span', { class: 'mono' }, x.number),
          x.ours ? json(x.ours) : '—', x.channel ? json(x.channel) : '—', x.action]))
        : h('p', { class: 'muted' }, 'No exceptions.')));
  }
}
