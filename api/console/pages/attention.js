// Attention, the landing page: what needs a person now, each a count and a list.

import { api, has, path, problem } from '../api.js';
import { add, age, badge, h, link, money, notice, table, time } from '../dom.js';

function card(title, count, body, more, wide) {
  const number = count === null
    ? h('div', { class: 'count muted' }, '—')
    : h('div', { class: `count ${count ? 'some' : 'zero'}` }, `${count}${more ? '+' : ''}`);
  return h('section', { class: wide ? 'panel span-all' : 'panel' }, h('h2', {}, title), number, body);
}

/** A link to what a workflow runs: its payment's page when it is a payment's, else the workflow's. */
export function workflowLink(w) {
  const input = w.input ?? {};
  if (w.name === 'payment' && input.tenant && input.request_no) {
    return link(['payment', input.tenant, input.request_no], input.request_no);
  }
  return link(['workflow', w.workflow_id], w.workflow_id);
}

async function unresolved() {
  const answer = await api('GET', '/v1/unresolved?limit=20');
  if (!answer.ok) return [card('Payments unresolved', null, notice(problem(answer), true))];
  const rows = answer.data.payments.map((u) => [
    age(u.age_seconds), u.tenant, link(['payment', u.tenant, u.payment.request_no], u.payment.request_no),
    u.payment.order_no, money(u.payment.amount, u.payment.currency), badge(u.payment.status)]);
  const oldest = answer.data.oldest_age_seconds;
  const cards = [card('Payments unresolved', answer.data.count, [
    h('p', { class: 'muted' }, oldest === undefined ? 'Every charge outcome is known.' : `The channel's answer is still unknown or processing; oldest ${age(oldest)}.`),
    rows.length ? table(['Age', 'Tenant', 'Payment', 'Order', 'Amount', 'Status'], rows) : null], false, rows.length > 0)];
  // Refunds likewise, when the server lists them.
  if (Array.isArray(answer.data.refunds)) {
    const refunds = answer.data.refunds.map((u) => [
      age(u.age_seconds), u.tenant, h('span', { class: 'mono' }, u.refund.refund_no),
      link(['payment', u.tenant, u.refund.request_no], u.refund.request_no), money(u.refund.amount, u.refund.currency), badge(u.refund.status)]);
    cards.push(card('Refunds unresolved', answer.data.refund_count, [
      h('p', { class: 'muted' }, refunds.length ? 'The channel\'s answer to these refunds is still unknown or processing.' : 'Every refund\'s outcome is known.'),
      refunds.length ? table(['Age', 'Tenant', 'Refund', 'Payment', 'Amount', 'Status'], refunds) : null], false, refunds.length > 0));
  }
  return cards;
}

async function workflowsIn(state, title, explain) {
  const answer = await api('GET', `/v1/workflows?state=${state}&limit=20`);
  if (!answer.ok) return card(title, null, notice(problem(answer), true));
  const list = answer.data.workflows;
  const more = answer.data.next_cursor ? link(['workflows'], 'All of them…', { state }) : null;
  return card(title, list.length, [
    h('p', { class: 'muted' }, explain),
    list.length ? table(['Updated', 'Workflow', 'Tenant', 'Why'], list.map((w) => [
      time(w.updated_at), workflowLink(w), w.input?.tenant ?? '—', w.error?.code ?? w.error?.message ?? '—'])) : null,
    more], Boolean(answer.data.next_cursor));
}

async function deliveries() {
  if (!(await has('get', '/v1/webhook-endpoints'))) return null;
  const endpoints = await api('GET', '/v1/webhook-endpoints');
  if (!endpoints.ok) return null;
  const list = Array.isArray(endpoints.data) ? endpoints.data : endpoints.data.endpoints ?? endpoints.data.webhook_endpoints ?? [];
  const failing = [];
  for (const e of list) {
    const d = await api('GET', `${path('webhook-endpoints', e.id)}/deliveries`);
    const items = d.ok ? (Array.isArray(d.data) ? d.data : d.data.deliveries ?? []) : [];
    for (const x of items) if (x.status === 'failed' || x.state === 'failed' || x.outcome === 'failed') failing.push([e.url ?? e.id, x]);
  }
  return card('Webhook deliveries failing', failing.length, failing.length ? table(['Endpoint', 'Event', 'Last attempt', 'Error'],
    failing.slice(0, 20).map(([url, x]) => [url, x.event_id ?? x.event ?? '—', time(x.attempted_at ?? x.updated_at ?? x.created_at), x.error ?? x.status_code ?? '—'])) : h('p', { class: 'muted' }, 'Every delivery went through or is being retried.'));
}

function yesterday() {
  const d = new Date(Date.now() - 86400000);
  return d.toISOString().slice(0, 10);
}

async function reconciliation(me) {
  if (!me.operator || !(await has('get', '/v1/reconciliations'))) return null;
  const date = yesterday();
  const answer = await api('GET', `/v1/reconciliations?date=${date}`);
  if (answer.status === 404) {
    return card(`Reconciliation of ${date}`, null, h('p', { class: 'muted' }, 'Not reconciled yet.'));
  }
  if (!answer.ok) return card(`Reconciliation of ${date}`, null, notice(problem(answer), true));
  const days = answer.data.reconciliations ?? [];
  const exceptions = days.flatMap((r) => (r.exceptions ?? []).map((x) => [r.tenant, x]));
  return card(`Reconciliation of ${date}: exceptions`, exceptions.length, [
    h('p', { class: 'muted' }, days.map((r) => `${r.tenant}: ${r.state}`).join(' · ')),
    exceptions.length ? table(['Tenant', 'Class', 'Kind', 'Number', 'Action'], exceptions.slice(0, 20).map(([t, x]) => [t, badge(x.class), x.kind, x.number, x.action])) : null,
    link(['reconciliation'], 'Open the day…', { date })]);
}

export async function render(target, ctx) {
  add(target, h('h1', {}, 'Attention'));
  const grid = h('div', { class: 'grid' });
  add(target, grid);
  const cards = await Promise.all([
    unresolved(),
    workflowsIn('compensation_failed', 'Workflows compensation_failed', 'A compensation could not finish: an operator must look (retry runs the compensations again).'),
    workflowsIn('failed', 'Workflows failed', 'Ended with a failure; those with nothing compensated can be retried.'),
    deliveries(),
    reconciliation(ctx.me),
  ]);
  if (ctx.current()) add(grid, cards);
}
