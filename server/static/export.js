// Transcript export: TXT, SRT, WebVTT and JSON, rendered from the finals. Pure.
//
// Every audio source has its own timeline (`start`/`end` count from when that source
// began streaming). A single-source meeting keeps those times exactly. With several
// sources, each timeline is placed on the meeting's clock by when its finals arrived
// (arrival − end, the smallest over the timeline, i.e. the least-delayed one), and the
// meeting clock starts at the earliest source.

import { displayName } from './protocol.js';

/** Who said a final: "Ana", or "Room (S2)" for a diarized source's voice. */
export function who(f) {
  return f.speaker ? `${displayName(f.participant)} (${f.speaker})` : displayName(f.participant);
}

/** 3725.5 → "01:02:05,500" (SRT) or "01:02:05.500" (VTT). */
export function timestamp(seconds, separator = ',') {
  const ms = Math.max(0, Math.round(seconds * 1000));
  const h = Math.floor(ms / 3600000);
  const m = Math.floor((ms % 3600000) / 60000);
  const s = Math.floor((ms % 60000) / 1000);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${pad(h)}:${pad(m)}:${pad(s)}${separator}${pad(ms % 1000, 3)}`;
}

/** 65.2 → "1:05", 3725 → "1:02:05". */
export function clock(seconds) {
  const t = Math.max(0, Math.floor(seconds));
  const h = Math.floor(t / 3600);
  const m = Math.floor((t % 3600) / 60);
  const s = String(t % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${s}` : `${m}:${s}`;
}

/**
 * Finals placed on one meeting clock, sorted by start (then seq). The server's
 * `wall_time` places them exactly (from the earliest source's origin, as its own
 * transcript does); without it, each source is anchored by when its finals arrived.
 * @returns {Array<object>} copies of the finals with `meetingStart`/`meetingEnd`
 */
export function onMeetingClock(finals) {
  if (finals.length && finals.every((f) => f.wall_time)) {
    const ms = (t) => Math.round(t * 1000) / 1000; // the protocol's precision
    const t0 = Math.min(...finals.map((f) => ms(f.wall_time.start - f.start)));
    return finals
      .map((f) => ({
        ...f,
        meetingStart: ms(f.wall_time.start - t0),
        meetingEnd: ms(Math.max(f.wall_time.end, f.wall_time.start) - t0),
      }))
      .sort((a, b) => a.meetingStart - b.meetingStart || (a.order ?? a.seq) - (b.order ?? b.seq));
  }
  const bySeq = [...finals].sort((a, b) => (a.order ?? a.seq) - (b.order ?? b.seq));
  // Split each participant's finals into timelines: a start far before the previous end
  // means the source reconnected as a new stream whose clock restarted at zero.
  const timelineOf = new Map();
  const lastEnd = new Map();
  const timelines = [];
  for (const f of bySeq) {
    let tl = timelineOf.get(f.participant);
    if (!tl || f.start < (lastEnd.get(f.participant) ?? 0) - 1.0) {
      tl = { anchor: null, finals: [] };
      timelines.push(tl);
      timelineOf.set(f.participant, tl);
    }
    tl.finals.push(f);
    lastEnd.set(f.participant, Math.max(f.end, f.start));
    if (f.receivedAt != null) {
      const a = f.receivedAt / 1000 - f.end;
      tl.anchor = tl.anchor === null ? a : Math.min(tl.anchor, a);
    }
  }
  const anchors = timelines.map((t) => t.anchor).filter((a) => a !== null);
  const t0 = anchors.length ? Math.min(...anchors) : 0;
  const out = [];
  for (const tl of timelines) {
    const offset = tl.anchor === null || timelines.length === 1 ? 0 : tl.anchor - t0;
    for (const f of tl.finals) {
      out.push({ ...f, meetingStart: offset + f.start, meetingEnd: offset + Math.max(f.end, f.start) });
    }
  }
  return out.sort((a, b) => a.meetingStart - b.meetingStart || (a.order ?? a.seq) - (b.order ?? b.seq));
}

const spoken = (finals) => onMeetingClock(finals).filter((f) => f.text.trim() !== '');

export function toTxt(finals, { meetingId = '' } = {}) {
  const lines = spoken(finals).map(
    (f) => `[${clock(f.meetingStart)}] ${who(f)}: ${f.text}`,
  );
  const head = meetingId ? [`Parley meeting ${meetingId}`, ''] : [];
  return `${[...head, ...lines].join('\n')}\n`;
}

/** A cue's end must come after its start; give zero-length ones a tenth of a second. */
const cueEnd = (f) => Math.max(f.meetingEnd, f.meetingStart + 0.1);

/** SubRip: numbered cues, "HH:MM:SS,mmm --> HH:MM:SS,mmm", blank line between. */
export function toSrt(finals) {
  return spoken(finals)
    .map((f, i) => `${i + 1}\n${timestamp(f.meetingStart)} --> ${timestamp(cueEnd(f))}\n`
      + `${who(f)}: ${f.text.replace(/\n+/g, ' ')}\n`)
    .join('\n');
}

const escapeVtt = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/** WebVTT with voice spans naming the speaker. */
export function toVtt(finals, { meetingId = '' } = {}) {
  const header = meetingId ? `WEBVTT - Parley meeting ${meetingId}\n\n` : 'WEBVTT\n\n';
  const cues = spoken(finals).map((f) => {
    const voice = escapeVtt(who(f)).replace(/\s+/g, ' ');
    return `${f.seq}\n${timestamp(f.meetingStart, '.')} --> ${timestamp(cueEnd(f), '.')}\n`
      + `<v ${voice}>${escapeVtt(f.text.replace(/\n+/g, ' '))}\n`;
  });
  return header + cues.join('\n');
}

export function toJson(finals, { meetingId = '', exportedAt = new Date() } = {}) {
  const items = onMeetingClock(finals).map((f) => {
    const item = {
      seq: f.seq,
      utterance_id: f.utterance_id,
      participant: f.participant,
      text: f.text,
      start: f.start,
      end: f.end,
      meeting_start: round3(f.meetingStart),
      meeting_end: round3(f.meetingEnd),
      language: f.language,
    };
    if (f.words) item.words = f.words;
    if (f.speaker) item.speaker = f.speaker;
    if (f.latency != null) item.latency_s = round3(f.latency);
    if (f.receivedAt != null) item.received_at = new Date(f.receivedAt).toISOString();
    return item;
  });
  return `${JSON.stringify({
    meeting_id: meetingId,
    exported_at: exportedAt.toISOString(),
    protocol: 1,
    finals: items,
  }, null, 2)}\n`;
}

const round3 = (x) => Math.round(x * 1000) / 1000;

export const FORMATS = Object.freeze({
  txt: { render: toTxt, mime: 'text/plain;charset=utf-8' },
  srt: { render: toSrt, mime: 'application/x-subrip;charset=utf-8' },
  vtt: { render: toVtt, mime: 'text/vtt;charset=utf-8' },
  json: { render: toJson, mime: 'application/json' },
});
