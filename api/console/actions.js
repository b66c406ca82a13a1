// Operator actions: each asks for confirmation and a reason, calls the API, and shows its answer.

import { api, problem } from './api.js';
import { h } from './dom.js';

/** Opens the confirmation for `action` (`{title, verb, explain, path, danger}`); `done` runs after the answer is
 * closed. */
export function confirmAction(action, done) {
  const dialog = document.getElementById('confirm');
  const reason = h('textarea', { id: 'reason', maxlength: '500', placeholder: 'Why (kept in the audit log)' });
  const answer = h('div', { id: 'answer', role: 'status' });
  const close = () => { dialog.close(); done(); };
  const go = h('button', { class: action.danger ? 'danger' : 'primary', type: 'button', id: 'confirm-action' }, action.verb);
  const cancel = h('button', { type: 'button', id: 'keep', on: { click: () => dialog.close() } }, 'Keep it as it is');
  go.addEventListener('click', async () => {
    go.disabled = true;
    cancel.disabled = true;
    reason.disabled = true;
    const text = reason.value.trim();
    const result = await api('POST', action.path, text ? { reason: text } : {});
    const said = result.ok
      ? `Done (HTTP ${result.status})${result.data && result.data.state ? `: the workflow is now ${result.data.state}` : ''}.`
      : `Refused: ${problem(result)}`;
    answer.replaceChildren(h('p', { class: result.ok ? '' : 'error' }, said));
    go.replaceWith(h('button', { class: 'primary', type: 'button', id: 'close-answer', on: { click: close } }, 'Close'));
    cancel.remove();
  });
  dialog.replaceChildren(h('div', { class: 'body' },
    h('h2', { id: 'confirm-title' }, action.title),
    h('p', {}, action.explain),
    h('label', { for: 'reason' }, 'Reason', reason),
    answer,
    h('div', { class: 'actions' }, go, cancel)));
  dialog.showModal();
  reason.focus();
}
