// The order of a workflow's timeline: its steps in the order they ran — their sequence, as the API lists them —
// whatever their times say (the steps of one phase share a time; a step resumed by a process whose clock is
// behind reads earlier than the one before it), and everything else (the request, operators' actions, refunds,
// events) among them by time.

/** `steps` (in the order they ran) and `others` (`{at, first?}`: `first` goes before steps of the same time)
 * as one list in the order things happened. */
export function ordered(steps, others) {
  const items = [];
  let rank = 0;
  // A step is placed at the latest time seen so far in the sequence: never before a step that ran before it.
  let high = -Infinity;
  for (const step of steps) {
    const t = Date.parse(step.at);
    if (!Number.isNaN(t) && t > high) high = t;
    items.push({ item: step, t: high, rank: rank++ });
  }
  for (const other of others) {
    const t = Date.parse(other.at);
    items.push({ item: other, t: Number.isNaN(t) ? Infinity : t, rank: other.first ? -1 : rank++ });
  }
  items.sort((a, b) => (a.t === b.t ? a.rank - b.rank : a.t < b.t ? -1 : 1));
  return items.map((i) => i.item);
}
