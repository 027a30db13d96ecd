// The ai package judges a UI message stream: node judge.mjs ai5|ai7 < cases.json
// Each case is {"name", "sse": "<the response body>", "message": <the UI message the client
// held before the stream, or null>}. For each it prints whether every chunk passed the
// package's own chunk schema (parseJsonEventStream with uiMessageChunkSchema, the client's
// parse path) and the message readUIMessageStream rebuilt (the client's fold), as JSON.
const major = process.argv[2];
const ai = await import(major);

const read = async (stream) => {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
};

const body = (text) => new ReadableStream({
  start(controller) {
    controller.enqueue(new TextEncoder().encode(text));
    controller.close();
  },
});

const cases = JSON.parse(await read(process.stdin).then((b) => Buffer.concat(b).toString("utf8")));
const results = [];
for (const c of cases) {
  const parsed = await read(ai.parseJsonEventStream({ stream: body(c.sse), schema: ai.uiMessageChunkSchema }));
  const invalid = parsed.filter((r) => !r.success).map((r) => String(r.error?.message ?? r.error).slice(0, 500));
  const chunks = parsed.filter((r) => r.success).map((r) => r.value);
  const errors = [];
  let message = null;
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  try {
    for await (const m of ai.readUIMessageStream({
      message: c.message ?? undefined,
      stream,
      onError: (e) => errors.push(String(e?.message ?? e)),
    })) {
      message = structuredClone(m);
    }
  } catch (e) {
    errors.push(`readUIMessageStream threw: ${e?.message ?? e}`);
  }
  results.push({ name: c.name, invalid, count: parsed.length, errors, message: JSON.parse(JSON.stringify(message)) });
}
process.stdout.write(JSON.stringify(results));
