// An example Tandem tool server in Node.js, written from protos/tandem/v1/tools.proto alone (nothing
// of Tandem's Python code): @grpc/grpc-js, @grpc/proto-loader and the official grpc-health-check.
//
// Tools (the same as ../calculator.py, exact with BigInt):
//   calculator {"expression": "12+34*5"}  integers joined by + - * (* binds tighter) -> the value
//   add / multiply {"a": "123", "b": "-45"}  integers as strings of digits -> the sum / product
// Contract: ListTools gives OpenAI-style function schemas; an unknown tool is NOT_FOUND, arguments
// that are not a JSON object or break the schema are INVALID_ARGUMENT naming the property; an
// expression that does not parse answers OK with is_error (the model sees why); grpc.health.v1
// reports SERVING. With --token-file / --token-env every call needs `authorization: Bearer <token>`
// (constant-time compare; health open only with --health-without-token); --tls-cert/--tls-key serve
// TLS (--tls-ca with --require-client-cert: mutual). Binds 127.0.0.1 unless --host says otherwise.
// No EnvironmentService here (the Python example serves one).
//
//   npm ci && node server.js --port 0 --port-file F
//   tandem conformance --contract tools 127.0.0.1:PORT
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

const SERVICE = 'tandem.v1.ToolService';
const PROTOS = path.resolve(__dirname, '..', '..', '..', '..', 'protos');
const MAX_EXPRESSION_CHARS = 4000;
const NUMBER = { type: 'string', pattern: '^-?[0-9]+$', description: 'an integer in decimal digits, e.g. "-123"' };

function tool(name, description, properties) {
  return { type: 'function', function: { name, description, parameters: {
    type: 'object', properties, required: Object.keys(properties).sort(), additionalProperties: false } } };
}

const TOOLS = [
  tool('calculator', 'Evaluate integers joined by + - * exactly (e.g. "12+34*5"); returns the integer.',
       { expression: { type: 'string', description: 'decimal integers joined by +, - and *' } }),
  tool('add', 'Add two integers exactly.', { a: NUMBER, b: NUMBER }),
  tool('multiply', 'Multiply two integers exactly.', { a: NUMBER, b: NUMBER }),
];
const BY_NAME = new Map(TOOLS.map((t) => [t.function.name, t.function]));

class Status extends Error {
  constructor(code, message) { super(message); this.code = code; }
}
class ToolFailed extends Error {}

function checkArguments(name, argumentsJson) {
  const fn = BY_NAME.get(name);
  if (!fn) throw new Status(grpc.status.NOT_FOUND, `no tool named '${name}' (tools: ${[...BY_NAME.keys()].join(', ')})`);
  const bad = (why) => new Status(grpc.status.INVALID_ARGUMENT, `${name}: ${why}`);
  let args;
  try { args = JSON.parse(argumentsJson); } catch (e) { throw bad(`arguments are not valid JSON: ${e.message}`); }
  if (args === null || typeof args !== 'object' || Array.isArray(args)) {
    throw bad(`arguments must be a JSON object, got ${Array.isArray(args) ? 'array' : typeof args}`);
  }
  const { properties, required } = fn.parameters;
  for (const key of Object.keys(args)) {
    if (!(key in properties)) throw bad(`unknown property '${key}' (properties: ${Object.keys(properties).join(', ')})`);
  }
  for (const key of required) if (!(key in args)) throw bad(`missing required property '${key}'`);
  for (const [key, value] of Object.entries(args)) {
    if (typeof value !== 'string') throw bad(`property '${key}' must be a string, got ${typeof value}`);
    const { pattern } = properties[key];
    if (pattern && !new RegExp(pattern).test(value)) {
      throw bad(`property '${key}' must be an integer in decimal digits, got ${JSON.stringify(value.slice(0, 40))}`);
    }
  }
  return args;
}

// integers joined by + - *; * binds tighter; a leading - negates a number
function evaluate(expression) {
  if (expression.length > MAX_EXPRESSION_CHARS) {
    throw new ToolFailed(`expression too long: ${expression.length} characters (at most ${MAX_EXPRESSION_CHARS})`);
  }
  const tokens = expression.match(/\d+|[-+*]|\S/g) || [];
  const shown = JSON.stringify(expression.slice(0, 80));
  let pos = 0;
  const takeNumber = () => {
    let sign = 1n;
    while (tokens[pos] === '-') { sign = -sign; pos += 1; }
    if (pos >= tokens.length || !/^\d+$/.test(tokens[pos])) {
      throw new ToolFailed(`expected a number, got ${pos < tokens.length ? JSON.stringify(tokens[pos]) : 'the end'} in ${shown}`);
    }
    return sign * BigInt(tokens[pos++]);
  };
  if (!tokens.length) throw new ToolFailed('empty expression');
  let total = 0n;
  let product = takeNumber();
  while (pos < tokens.length) {
    const op = tokens[pos++];
    if (op === '*') product *= takeNumber();
    else if (op === '+' || op === '-') { total += product; product = op === '+' ? takeNumber() : -takeNumber(); }
    else throw new ToolFailed(`expected + - or *, got ${JSON.stringify(op)} in ${shown}`);
  }
  return total + product;
}

function runTool(name, args) {
  if (name === 'calculator') return evaluate(args.expression).toString();
  const a = BigInt(args.a);
  const b = BigInt(args.b);
  return (name === 'add' ? a + b : a * b).toString();
}

function callTool(call, callback) {
  // instance_kwargs_json (a row's kwargs) is left unread: exact arithmetic needs nothing of the row
  const { name, arguments_json: argumentsJson } = call.request;
  try {
    const args = checkArguments(name, argumentsJson);
    callback(null, { text: runTool(name, args), is_error: false });
  } catch (e) {
    if (e instanceof ToolFailed) return callback(null, { text: `${name}: ${e.message}`, is_error: true });
    if (e instanceof Status) return callback({ code: e.code, details: e.message });
    callback({ code: grpc.status.INTERNAL, details: String(e) });
  }
}

function listTools(call, callback) {
  callback(null, { tools: TOOLS.map((t) => ({ json: JSON.stringify(t) })) });
}

function parseArgs(argv) {
  const opts = { host: '127.0.0.1', port: '0' };
  const flags = ['health_without_token', 'require_client_cert'];
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '').replace(/-/g, '_');
    if (flags.includes(key)) opts[key] = true;
    else if (i + 1 < argv.length) opts[key] = argv[++i];
    else throw new Error(`--${key} needs a value`);
  }
  return opts;
}

function readToken({ token_file: file, token_env: env }) {
  if (file && env) throw new Error('set --token-file or --token-env, not both');
  const token = file ? fs.readFileSync(file, 'utf8').trim() : env ? (process.env[env] || '').trim() : null;
  if ((file || env) && !token) throw new Error('the token is empty');
  return token;
}

// A server interceptor: calls without `authorization: Bearer <token>` end UNAUTHENTICATED.
function requireToken(token, healthOpen) {
  const want = Buffer.from(`Bearer ${token}`);
  const matches = (sent) => sent.length === 1 && Buffer.byteLength(String(sent[0])) === want.length
    && crypto.timingSafeEqual(Buffer.from(String(sent[0])), want);
  return (descriptor, call) => new grpc.ServerInterceptingCall(call, {
    start: (next) => next({
      onReceiveMetadata: (metadata, pass) => {
        const sent = metadata.get('authorization');
        if (matches(sent) || (healthOpen && descriptor.path.startsWith('/grpc.health.v1.Health/'))) return pass(metadata);
        call.sendStatus({ code: grpc.status.UNAUTHENTICATED, details: sent.length ? 'invalid bearer token' : 'missing bearer token' });
      },
    }),
  });
}

function serverCredentials(opts) {
  if (!opts.tls_cert) return grpc.ServerCredentials.createInsecure();
  const keyPair = { private_key: fs.readFileSync(opts.tls_key), cert_chain: fs.readFileSync(opts.tls_cert) };
  return grpc.ServerCredentials.createSsl(opts.tls_ca ? fs.readFileSync(opts.tls_ca) : null, [keyPair],
                                          Boolean(opts.require_client_cert));
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const token = readToken(opts);
  const proto = grpc.loadPackageDefinition(protoLoader.loadSync('tandem/v1/tools.proto', {
    includeDirs: [PROTOS], keepCase: true, defaults: true }));
  const server = new grpc.Server({ interceptors: token ? [requireToken(token, opts.health_without_token)] : [] });
  server.addService(proto.tandem.v1.ToolService.service, { ListTools: listTools, CallTool: callTool });
  const health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE]: 'NOT_SERVING' });
  health.addToServer(server);
  server.bindAsync(`${opts.host}:${opts.port}`, serverCredentials(opts), (err, port) => {
    if (err) { console.error(`node tools: cannot bind: ${err.message}`); process.exit(1); }
    for (const name of ['', SERVICE]) health.setStatus(name, 'SERVING');
    if (opts.port_file) { // atomically, once SERVING
      fs.writeFileSync(`${opts.port_file}.tmp`, `${port}\n`);
      fs.renameSync(`${opts.port_file}.tmp`, opts.port_file);
    }
    console.log(`node tools: serving on ${opts.host}:${port} (tls: ${Boolean(opts.tls_cert)}, token: ${Boolean(token)})`);
  });
  const stop = () => {
    for (const name of ['', SERVICE]) health.setStatus(name, 'NOT_SERVING');
    server.tryShutdown(() => {
      if (opts.port_file && fs.existsSync(opts.port_file)) fs.unlinkSync(opts.port_file);
      process.exit(0);
    });
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
