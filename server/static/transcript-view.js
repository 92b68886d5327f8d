// The transcript on screen: finals in seq order with speaker, time and latency; partials
// in place below them, muted, replaced by their final; notices (reconnects) inline.
// Follows the newest line unless the reader scrolled up.

import { displayName } from './protocol.js';

export const PALETTE_SIZE = 12;

/** A participant's colour slot: the same name gets the same colour on every page. */
export function colourIndex(participant) {
  let h = 0x811c9dc5; // FNV-1a
  for (const ch of String(participant)) {
    h ^= ch.codePointAt(0);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % PALETTE_SIZE;
}

/** The colour class of a speaker label: S1 → sp-1 … (six colours, then round again). */
export function speakerClass(speaker) {
  const n = Number(String(speaker).replace(/^\D+/, '')) || 0;
  return `sp-${((n - 1) % 6 + 6) % 6 + 1}`;
}

const timeFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export class TranscriptView {
  /**
   * @param {HTMLOListElement} list  the scrolling <ol>
   * @param {{jumpButton: HTMLButtonElement, empty: HTMLElement}} parts
   */
  constructor(list, { jumpButton, empty }) {
    this.list = list;
    this.jump = jumpButton;
    this.empty = empty;
    this.follow = true;
    this.partialEls = new Map();
    this.finalEls = new Map(); // final.key → li
    list.addEventListener('scroll', () => {
      this.follow = this.#atBottom();
      if (this.follow) this.jump.hidden = true;
    }, { passive: true });
    jumpButton.addEventListener('click', () => {
      this.follow = true;
      this.#scroll(true);
      this.jump.hidden = true;
      this.list.focus({ preventScroll: true });
    });
  }

  clear() {
    this.list.replaceChildren();
    this.partialEls.clear();
    this.finalEls.clear();
    this.follow = true;
    this.jump.hidden = true;
    this.empty.hidden = false;
  }

  #atBottom() {
    const l = this.list;
    return l.scrollHeight - l.scrollTop - l.clientHeight < 48;
  }

  #scroll(force = false) {
    this.empty.hidden = this.list.childElementCount > 0;
    if (this.follow || force) {
      this.list.scrollTop = this.list.scrollHeight;
    } else {
      this.jump.hidden = false;
    }
  }

  #meta(participant, extra, speaker = null) {
    const who = el('span', { class: `who pc-${colourIndex(participant)}` }, displayName(participant));
    return el('div', { class: 'meta' },
      speaker ? el('span', { class: 'whobox' }, who, this.#speakerChip(speaker)) : who,
      ...extra);
  }

  /** A diarized final's speaker ("S2"), in that label's own colour, under the name. */
  #speakerChip(speaker) {
    return el('span', { class: `spk ${speakerClass(speaker)}`, title: `Voice ${speaker} of this source` }, speaker);
  }

  /** Show or update the partial of an utterance. */
  showPartial(p) {
    let li = this.partialEls.get(p.utterance_id);
    if (!li) {
      li = el('li', { class: 'utt partial', 'aria-hidden': 'true', dataset: { utterance: p.utterance_id } },
        this.#meta(p.participant, [el('span', { class: 'speaking' }, 'speaking…')]),
        el('p', { class: 'text' }));
      this.partialEls.set(p.utterance_id, li);
      this.list.append(li);
    }
    li.querySelector('.text').textContent = p.text || '…';
    this.#scroll();
  }

  removePartial(utteranceId) {
    this.partialEls.get(utteranceId)?.remove();
    this.partialEls.delete(utteranceId);
    this.#scroll();
  }

  #latencyChip(f) {
    if (f.latency == null) return null;
    return el('span', {
      class: 'lat',
      title: 'Final latency: from sending the audio at the utterance’s end to receiving this final',
    }, `${f.latency.toFixed(2)} s`);
  }

  /** Insert a new final where its order belongs, replacing its partial if shown. */
  addFinal(f) {
    const when = f.receivedAt ?? null;
    const li = el('li', { class: 'utt final', dataset: { seq: String(f.seq), order: String(f.order), utterance: f.utterance_id ?? '' } },
      this.#meta(f.participant, [
        when === null ? null : el('time', { datetime: new Date(when).toISOString() }, timeFmt.format(when)),
        el('span', { class: 'span', title: `Audio ${f.start.toFixed(2)}–${f.end.toFixed(2)} s of this speaker’s stream` },
          `${f.start.toFixed(1)}–${f.end.toFixed(1)} s`),
        this.#latencyChip(f),
      ], f.speaker),
      el('p', { class: 'text' }, f.text || '(no words)'));
    this.finalEls.set(f.key, li);
    const partial = f.utterance_id ? this.partialEls.get(f.utterance_id) : null;
    this.partialEls.delete(f.utterance_id);
    let next = null; // first final li that sorts after this one
    for (const node of this.finalEls.values()) {
      const order = Number(node.dataset.order);
      if (order > f.order && (next === null || order < Number(next.dataset.order))) next = node;
    }
    if (next) {
      next.before(li);
      partial?.remove();
    } else if (partial && !partial.nextElementSibling?.closest?.('.final')) {
      partial.replaceWith(li); // in place: the line the reader was watching turns final
    } else {
      const firstPartial = this.list.querySelector(':scope > .partial');
      if (firstPartial) firstPartial.before(li); else this.list.append(li);
      partial?.remove();
    }
    this.#scroll();
  }

  /** A final we already show learned its latency (the other socket delivered it). */
  updateFinal(f) {
    const li = this.finalEls.get(f.key);
    if (!li || li.querySelector('.lat') || f.latency == null) return;
    li.querySelector('.meta').append(this.#latencyChip(f));
  }

  /** A final's speaker changed (`transcript.speaker`): redraw its label. */
  updateSpeaker(f) {
    const li = this.finalEls.get(f.key);
    const chip = li?.querySelector('.spk');
    if (!chip) return;
    chip.className = `spk ${speakerClass(f.speaker)}`;
    chip.textContent = f.speaker;
    chip.title = `Voice ${f.speaker} of this source`;
  }

  /** A line about the connection (dropped, reconnected), placed after the finals. */
  addNotice(text, kind = 'info') {
    const li = el('li', { class: `notice notice-${kind}`, role: 'note' },
      el('time', { datetime: new Date().toISOString() }, timeFmt.format(Date.now())), ' ', text);
    const firstPartial = this.list.querySelector(':scope > .partial');
    if (firstPartial) firstPartial.before(li); else this.list.append(li);
    this.#scroll();
  }
}
