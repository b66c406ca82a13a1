// Find: one box for whatever a customer or the channel quotes — an order number, a payment's or refund's number,
// a token, a charge id, a workflow or event id — opening what it names (several matches: a list).

import { api, has, path, problem } from '../api.js';
import { add, badge, h, link, money, notice, table, time } from '../dom.js';

/** The search box, filled with `q`. */
export function box(q) {
  const input = h('input', { type: 'search', name: 'q', id: 'q', class: 'wide', value: q ?? '', autocomplete: 'off',
    placeholder: 'order_no, request_no, refund_no, token, charge_id, workflow or event id' });
  const form = h('form', { class: 'inline', role: 'search', on: { submit: (e) => {
    e.preventDefault();
    const value = input.value.trim();
    if (value) location.hash = `#/find?${new URLSearchParams({ q: value })}`;
  } } }, h('label', { for: 'q' }, 'Find', input), h('button', { class: 'primary', type: 'submit', id: 'find' }, 'Find'));
  return { form, input };
}

export async function render(target, ctx) {
  const q = ctx.params.get('q') ?? '';
  const { form, input } = box(q);
  add(target, h('h1', {}, 'Find'), h('div', { class: 'panel' }, form));
  if (!q) { input.focus(); return; }
  const [searched, refund, event] = await Promise.all([
    api('GET', `/v1/search?${new URLSearchParams({ q })}`),
    (async () => (await has('get', '/v1/refunds/{refund_no}')) ? api('GET', path('refunds', q)) : null)(),
    (async () => (await has('get', '/v1/events/{id}')) ? api('GET', path('events', q)) : null)(),
  ]);
  if (!ctx.current()) return;
  if (!searched.ok) { add(target, notice(`Search failed: ${problem(searched)}`, true)); return; }
  const rows = [];
  for (const m of searched.data.matches) {
    if (m.kind === 'payment') {
      rows.push([m.matched, 'payment', m.tenant, link(['payment', m.tenant, m.payment.request_no], m.payment.request_no),
        m.payment.order_no, money(m.payment.amount, m.payment.currency), badge(m.payment.status), time(m.created_at)]);
    } else if (m.kind === 'order') {
      rows.push([m.matched, 'order (no payment)', m.tenant, '—', m.order.order_no, money(m.order.amount, m.order.currency), badge(m.order.status), time(m.order.updated_at)]);
    } else {
      rows.push([m.matched, m.kind, m.tenant ?? '—', link(['workflow', m.workflow_id], m.workflow_id), '—', '—', '—', '—']);
    }
  }
  if (refund && refund.ok && refund.data) {
    const r = refund.data;
    rows.push(['refund_no', 'refund', r.tenant ?? ctx.me.tenant ?? '—', r.request_no ? link(['payment', ctx.me.tenant ?? '', r.request_no], r.request_no) : '—',
      r.order_no ?? '—', money(r.amount, r.currency), badge(r.status), time(r.created_at)]);
  }
  if (event && event.ok && event.data) {
    const e = event.data;
    const data = e.data ?? {};
    const where = data.request_no ? link(['payment', e.tenant, data.request_no], data.request_no) : '—';
    rows.push(['event id', `event ${e.type}`, e.tenant ?? '—', where, data.order_no ?? '—', money(data.amount, data.currency), badge(data.status), time(e.created_at)]);
  }
  const payments = searched.data.matches.filter((m) => m.kind === 'payment');
  if (rows.length === 1 && payments.length === 1) {
    // One payment: open it.
    location.replace(`#/payment/${encodeURIComponent(payments[0].tenant)}/${encodeURIComponent(payments[0].payment.request_no)}`);
    return;
  }
  const panel = h('section', { class: 'panel', id: 'results' });
  if (!rows.length) {
    add(panel, h('p', { id: 'no-match' }, 'Nothing matches ', h('q', { class: 'mono wrap' }, q), '.'));
  } else {
    add(panel, h('h2', {}, `${rows.length} matches for `, h('q', { class: 'mono wrap' }, q)),
      table(['Matched', 'What', 'Tenant', 'Payment', 'Order', 'Amount', 'Status', 'When'], rows));
  }
  add(target, panel);
}
