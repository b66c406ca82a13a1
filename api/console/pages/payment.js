// A payment (or any workflow): the order and the payment, the workflow as a timeline in the order things happened
// (steps with attempts, times, the channel's answers; operator actions), its compensations, and the actions an
// operator may take on it.

import { confirmAction } from '../actions.js';
import { api, has, path, problem } from '../api.js';
import { add, badge, facts, h, json, money, notice, table, time } from '../dom.js';
import { ordered } from '../timeline.js';

/** How often a page of a workflow still moving reads it again. */
const LIVE_MS = 1500;

async function paymentOf(ctx, tenant, requestNo) {
  const query = new URLSearchParams({ q: requestNo });
  if (ctx.me.role === 'operator') query.set('tenant', tenant);
  const answer = await api('GET', `/v1/search?${query}`);
  if (!answer.ok) return { error: problem(answer) };
  return { match: answer.data.matches.find((m) => m.kind === 'payment' && m.payment.request_no === requestNo && m.tenant === tenant) };
}

/** The workflow's timeline: steps in the order they ran (their sequence, not their times), and operator
 * actions, the request, refunds and events among them by time (see `timeline.js`). */
function timeline(view, audit, extra) {
  const steps = [];
  for (const s of view ? view.steps : []) {
    const answer = s.error ?? s.output;
    steps.push({ at: s.started_at, node: h('li', { class: 'step-item' },
      h('div', {}, time(s.started_at)),
      h('div', { class: 'what' },
        h('div', { class: 'head' }, h('strong', { class: 'mono' }, s.step_key), badge(s.status),
          h('span', { class: 'muted' }, `${s.kind} · ${s.attempts} attempt${s.attempts === 1 ? '' : 's'}`),
          s.finished_at ? h('span', { class: 'muted' }, 'finished ', time(s.finished_at)) : null),
        answer === undefined ? null : h('details', {}, h('summary', {}, s.error ? 'error' : 'output'), json(answer)))) });
  }
  const others = [];
  for (const a of audit) {
    others.push({ at: a.at, node: h('li', { class: 'audit-item' },
      h('div', {}, time(a.at)),
      h('div', { class: 'what' },
        h('div', { class: 'head' }, h('strong', {}, `${a.action}`), a.actor ? h('span', {}, `by ${a.actor}`) : null,
          a.status ? badge(a.status < 300 ? 'done' : 'refused') : badge('unknown')),
        a.reason ? h('div', {}, 'Reason: ', h('q', { class: 'reason' }, a.reason)) : a.actor ? h('div', { class: 'muted' }, 'No reason given.') : null,
        h('div', { class: 'muted' }, a.result ?? 'No answer recorded (the process stopped midway).'))) });
  }
  // What happened first at a time shared with steps (the payment's request) goes before them.
  others.push(...extra);
  return h('ol', { class: 'timeline', id: 'timeline' }, ordered(steps, others).map((i) => i.node));
}

function actionsFor(ctx, view, canQuery) {
  if (!ctx.me.operator || !view) return null;
  const w = view.workflow;
  const id = w.workflow_id;
  const buttons = [];
  const act = (verb, title, explain, route, danger) => h('button', { type: 'button', class: danger ? 'danger' : '', id: `action-${route}`,
    on: { click: () => confirmAction({ title, verb, explain, path: `${path('workflows', id)}/${route}`, danger }, ctx.refresh) } }, verb);
  if (w.state === 'running') {
    buttons.push(act(ctx.page === 'payment' ? 'Cancel the payment' : 'Cancel the workflow', `Cancel ${id}?`, 'Any run now is fenced out and the compensations run: a charge in flight is closed at the channel, and refunded if it went through.', 'cancel', true));
  }
  if (canQuery && (w.state === 'running' || w.state === 'compensating')) {
    buttons.push(act('Ask the channel now', `Ask the channel about ${id} now?`, 'The channel is asked at once about the outcome still unknown, and the payment is settled from its answer.', 'query-channel'));
  }
  if (w.state === 'failed' || w.state === 'compensation_failed') {
    buttons.push(act('Retry it', `Retry ${id}?`, w.state === 'compensation_failed' ? 'Its compensations run again.' : 'It runs forward again from the failed step (only when nothing was compensated).', 'retry'));
  }
  return buttons.length ? h('div', { class: 'actions', id: 'actions' }, buttons) : null;
}

async function section(title, id, draw) {
  const body = await draw();
  return body ? h('section', { class: 'panel', id }, h('h2', {}, title), body) : null;
}

export async function render(target, ctx) {
  let workflowId;
  let match = null;
  if (ctx.page === 'payment') {
    const [tenant, requestNo] = ctx.parts;
    const found = await paymentOf(ctx, tenant ?? '', requestNo ?? '');
    if (found.error) { add(target, notice(found.error, true)); return; }
    match = found.match;
    if (!match) { add(target, h('h1', {}, 'Payment ', h('span', { class: 'mono' }, requestNo ?? '')), notice('No such payment (or not yours).', true)); return; }
    workflowId = match.payment.workflow_id;
  } else {
    workflowId = ctx.parts[0] ?? '';
  }
  const [viewAnswer, auditAnswer, canQuery] = await Promise.all([
    api('GET', path('workflows', workflowId)),
    api('GET', `/v1/audit?${new URLSearchParams({ workflow_id: workflowId })}`),
    has('post', '/v1/workflows/{workflow_id}/query-channel'),
  ]);
  if (!ctx.current()) return;
  const view = viewAnswer.ok ? viewAnswer.data : null;
  const audit = view ? view.audit : auditAnswer.ok ? auditAnswer.data.audit : [];
  const extra = [];
  const sections = [];

  if (match) {
    const p = match.payment;
    const o = match.order;
    add(target, h('h1', {}, 'Payment ', h('span', { class: 'mono', id: 'request-no' }, p.request_no), badge(p.status)));
    sections.push(h('div', { class: 'grid' },
      h('section', { class: 'panel', id: 'payment' }, h('h2', {}, 'Payment'), facts([
        ['Tenant', match.tenant], ['Amount', money(p.amount, p.currency)], ['Status', badge(p.status)],
        ['Charge id', p.charge_id ? h('span', { class: 'mono' }, p.charge_id) : null],
        ['Declined', p.decline_code], ['Refunded', typeof p.refunded_amount === 'number' ? money(p.refunded_amount, p.currency) : null],
        ['Created', time(match.created_at)], ['Workflow', h('span', { class: 'mono wrap' }, p.workflow_id)]])),
      h('section', { class: 'panel', id: 'order' }, h('h2', {}, 'Order'), o ? facts([
        ['Order', h('span', { class: 'mono', id: 'order-no' }, o.order_no)], ['Amount', money(o.amount, o.currency)],
        ['Status', badge(o.status)], ['Version', o.version], ['Updated', time(o.updated_at)]]) : h('p', { class: 'muted' }, '—'))));
    extra.push({ at: match.created_at, first: true, node: h('li', {}, h('div', {}, time(match.created_at)),
      h('div', { class: 'what' }, h('strong', {}, 'Payment requested'), h('span', { class: 'muted' }, `${p.order_no}`))) });
    const refunds = await section('Refunds', 'refunds', async () => {
      if (!(await has('get', '/v1/payments/{request_no}/refunds'))) return null;
      const r = await api('GET', `${path('payments', p.request_no)}/refunds`);
      if (!r.ok) return null;
      const list = r.data.refunds ?? [];
      for (const x of list) {
        extra.push({ at: x.created_at, node: h('li', {}, h('div', {}, time(x.created_at)), h('div', { class: 'what' },
          h('div', { class: 'head' }, h('strong', {}, 'Refund '), h('span', { class: 'mono' }, x.refund_no), badge(x.status), money(x.amount, x.currency)))) });
      }
      return list.length ? table(['Refund', 'Amount', 'Status', 'Reason', 'Created'], list.map((x) => [h('span', { class: 'mono' }, x.refund_no), money(x.amount, x.currency), badge(x.status), x.reason ?? '—', time(x.created_at)])) : h('p', { class: 'muted' }, 'None.');
    });
    const events = await section('Events', 'events', async () => {
      if (!(await has('get', '/v1/payments/{request_no}/events'))) return null;
      const r = await api('GET', `${path('payments', p.request_no)}/events`);
      if (!r.ok) return null;
      const list = r.data.events ?? [];
      const canRedeliver = await has('post', '/v1/events/{event_id}/redeliver');
      return list.length ? table(['Event', 'Type', 'Created', ''], list.map((e) => [h('span', { class: 'mono' }, e.id), e.type, time(e.created_at),
        canRedeliver && ctx.me.operator ? h('button', { type: 'button', on: { click: () => confirmAction({ title: `Redeliver ${e.id}?`, verb: 'Redeliver',
          explain: 'The event is sent again now, with the same id, to every endpoint subscribed to it.', path: `${path('events', e.id)}/redeliver` }, ctx.refresh) } }, 'Redeliver') : ''])) : h('p', { class: 'muted' }, 'None.');
    });
    sections.push(refunds, events);
  } else {
    add(target, h('h1', {}, 'Workflow ', h('span', { class: 'mono wrap' }, workflowId), view ? badge(view.workflow.state) : null));
  }

  if (view) {
    const w = view.workflow;
    sections.splice(1, 0, h('section', { class: 'panel', id: 'workflow' },
      h('h2', {}, 'Workflow ', badge(w.state)),
      facts([['Id', h('span', { class: 'mono wrap' }, w.workflow_id)], ['Type', w.name], ['Created', time(w.created_at)], ['Updated', time(w.updated_at)],
        ['Next attempt', w.next_attempt_at && !w.lease_expires_at ? time(w.next_attempt_at) : null], ['Held until', w.lease_expires_at ? time(w.lease_expires_at) : null],
        ['Waiting for', w.waiting_for ? (typeof w.waiting_for === 'string' ? w.waiting_for : json(w.waiting_for)) : null],
        ['Failure', w.error ? json(w.error) : null]]),
      actionsFor(ctx, view, canQuery)));
  } else {
    sections.splice(1, 0, notice(viewAnswer.status === 404
      ? 'The workflow\'s history is no longer kept (retention deleted it); its audit log is below.'
      : `The workflow could not be read: ${problem(viewAnswer)}`, viewAnswer.status !== 404));
  }
  sections.push(h('section', { class: 'panel' }, h('h2', {}, 'Timeline'), timeline(view, audit, extra)));
  if (view && view.compensations.length) {
    sections.push(h('section', { class: 'panel', id: 'compensations' }, h('h2', {}, 'Compensations'),
      table(['Seq', 'Undoes', 'Compensation', 'Status'], view.compensations.map((c) => [c.seq, h('span', { class: 'mono' }, c.step_key), c.name, badge(c.status)]))));
  }
  sections.push(h('section', { class: 'panel', id: 'audit' }, h('h2', {}, 'Audit log'), audit.length
    ? table(['When', 'Who', 'Action', 'Reason', 'Result'], audit.map((a) => [time(a.at), a.actor ?? '—', a.action, a.reason ?? '—', a.result ?? 'no answer recorded']))
    : h('p', { class: 'muted' }, 'No operator has acted on it.')));
  if (!ctx.current()) return;
  add(target, sections);
  if (view && (view.workflow.state === 'running' || view.workflow.state === 'compensating')) {
    // Read again while it moves; while a confirmation is open the refresh waits (and is not given up).
    const tick = () => {
      if (!ctx.current()) return;
      if (document.getElementById('confirm').open) setTimeout(tick, LIVE_MS);
      else ctx.refresh();
    };
    setTimeout(tick, LIVE_MS);
  }
}
