// The official OpenAI Node SDK against aned-http, with tools: chat.completions.create
// (streamed and not) and the runTools helper; logprobs on both endpoints. The model (mk_chain_model.py) always
// answers with one call get_weather({"city": "Paris"}) in its template's Hermes syntax,
// so every check below needs the call parsed out of the reply and carried through
// OpenAI's shapes. Prints "N passed, M failed".
// Then embeddings, on EMB_BASE_URL (a gateway to a model with real weights).
//   node openai_sdk.mjs BASE_URL API_KEY NODE_MODULES_DIR EMB_BASE_URL
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const [baseURL, apiKey, modules, embURL] = process.argv.slice(2);
const require = createRequire(modules + '/');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const emb = new OpenAI({ baseURL: embURL, apiKey, maxRetries: 0, timeout: 60000 });

let passed = 0, failed = 0;
async function check(name, fn) {
  try { await fn(); passed++; console.log('ok   ' + name); }
  catch (e) { failed++; console.log('FAIL ' + name + ': ' + (e && e.stack || e)); }
}

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

await check('create with tools', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, tools, temperature: 0, max_tokens: 64 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.role, 'assistant');
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  const tc = c.message.tool_calls[0];
  assert.equal(tc.type, 'function');
  assert.match(tc.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(tc.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris' });
});

await check('create with tools, streamed', async () => {
  const s = await client.chat.completions.create({ model: 'any', messages, tools, temperature: 0, max_tokens: 64, stream: true });
  const calls = [];
  let finish = null, content = '';
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const d of ch.delta.tool_calls || []) {
      const c = calls[d.index] || (calls[d.index] = { id: '', name: '', arguments: '' });
      if (d.id) c.id = d.id;
      if (d.function && d.function.name) c.name += d.function.name;
      if (d.function && d.function.arguments) c.arguments += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris' });
  // the SDK's own accumulation of the same stream
  const s2 = client.beta.chat.completions.stream({ model: 'any', messages, tools, temperature: 0, max_tokens: 64 });
  const fin = await s2.finalChatCompletion();
  assert.equal(fin.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(fin.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris' });
});

await check('tool_choice none: the reply is text', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, tools, tool_choice: 'none', temperature: 0, max_tokens: 64 });
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.match(r.choices[0].message.content, /^<tool_call>/);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await check('tool_choice required and named: a call, finish_reason tool_calls', async () => {
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    // one call, arguments bounded: the chain model's greedy reply would otherwise go round
    const strict = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
      properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false } } }];
    const r = await client.chat.completions.create({ model: 'any', messages, tools: strict, tool_choice, max_tokens: 200, temperature: 0,
                                                     parallel_tool_calls: false });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls && calls.length === 1 && calls[0].function.name === 'get_weather');
    assert.equal(typeof JSON.parse(calls[0].function.arguments), 'object');
  }
});

await check('runTools', async () => {
  const seen = [];
  const runner = client.beta.chat.completions.runTools({
    model: 'any', messages, temperature: 0, max_tokens: 64,
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
      parameters: tools[0].function.parameters, parse: JSON.parse,
      function: async (args) => { seen.push(args); return 'sunny, 21 C'; } } }],
  }, { maxChatCompletions: 2 });
  await runner.done();
  // each of the two completions called the function; the second was asked with the
  // first call and its result in the conversation (assistant tool_calls + a tool message)
  assert.equal(seen.length, 2);
  assert.deepEqual(seen[0], { city: 'Paris' });
  const msgs = runner.messages;
  const toolMsgs = msgs.filter((m) => m.role === 'tool');
  assert.ok(toolMsgs.length >= 1 && toolMsgs[0].content === 'sunny, 21 C');
  assert.ok(msgs.some((m) => m.role === 'assistant' && m.tool_calls && m.tool_calls[0].id === toolMsgs[0].tool_call_id));
});

// embeddings: the SDK asks for base64 by default and decodes it to floats itself
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
await check('embeddings (base64, the SDK default)', async () => {
  const r = await emb.embeddings.create({ model: 'any', input: ['The weather in Paris', 'Paris', 'rain'] });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, 3);
  r.data.forEach((d, i) => { assert.equal(d.index, i); assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5); });
  assert.ok(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens);
  // the same float32 values as the decimal form (%.9g: each rounds back to its float32)
  const f = await emb.embeddings.create({ model: 'any', input: 'Paris', encoding_format: 'float' });
  assert.deepEqual(Array.from(r.data[1].embedding), f.data[0].embedding.map(Math.fround));
});
await check('embeddings with dimensions', async () => {
  const r = await emb.embeddings.create({ model: 'any', input: [[1, 2, 3], [4, 5]], dimensions: 8 });
  assert.equal(r.data.length, 2);
  r.data.forEach((d) => { assert.equal(d.embedding.length, 8); assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5); });
  await assert.rejects(emb.embeddings.create({ model: 'any', input: 'x', dimensions: 1 << 19 }),
    (e) => e.status === 400 && e.param === 'dimensions');
});

await check('chat logprobs, whole and streamed', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, temperature: 0, max_tokens: 6,
                                                   logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0 && Array.isArray(e.bytes) && e.top_logprobs.length === 3);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);   // greedy: the chosen is the likeliest
  }
  const s = await client.chat.completions.create({ model: 'any', messages, temperature: 0, max_tokens: 6,
                                                   logprobs: true, top_logprobs: 3, stream: true });
  const got = [];
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (ch && ch.logprobs && ch.logprobs.content) got.push(...ch.logprobs.content);
  }
  assert.deepEqual(got, content);
});

await check('completions logprobs and echo (a loglikelihood request)', async () => {
  const r = await client.completions.create({ model: 'any', prompt: 'What is the weather', max_tokens: 0, echo: true,
                                             logprobs: 1, temperature: 0 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.token_logprobs.length, r.usage.prompt_tokens);
  assert.equal(lp.token_logprobs[0], null);
  assert.ok(lp.token_logprobs.slice(1).every((v) => v <= 0));
  assert.equal(lp.tokens.length, lp.text_offset.length);
  assert.equal(r.usage.completion_tokens, 0);
  await assert.rejects(client.completions.create({ model: 'any', prompt: 'x', logprobs: 21 }), (e) => e.status === 400);
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
