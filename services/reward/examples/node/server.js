// An external Tandem reward service in Node.js, written from protos/tandem/v1/reward.proto and
// data.proto alone (nothing of Tandem's Python code): @grpc/grpc-js, @grpc/proto-loader and the
// official grpc-health-check service.
//
// Rule (the same as ../external_server.py): a row scores 1 when its response contains the ground
// truth as a whole-number token ("it is 168." matches 168; 1680 and 16.8 do not), else 0.
// Contract: one score per row in order; a malformed request is INVALID_ARGUMENT naming the field;
// grpc.health.v1 reports SERVING; deadlines are grpc-js's; with --token-file / --token-env every
// call needs `authorization: Bearer <token>` (compared in constant time; health open only with
// --health-without-token); with --tls-cert/--tls-key the port speaks TLS (--tls-ca with
// --require-client-cert: mutual TLS). Binds 127.0.0.1 unless --host says otherwise.
//
//   npm ci && node server.js --port 0 --port-file F
//   tandem run services.reward.endpoint=127.0.0.1:PORT
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

const SERVICE = 'tandem.v1.RewardService';
const PROTOS = path.resolve(__dirname, '..', '..', '..', '..', 'protos');
const REQUIRED = ['response_text', 'ground_truth'];

function parseArgs(argv) {
  const opts = { host: '127.0.0.1', port: '0' };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '').replace(/-/g, '_');
    if (['health_without_token', 'require_client_cert'].includes(key)) { opts[key] = true; continue; }
    if (i + 1 >= argv.length) throw new Error(`--${key} needs a value`);
    opts[key] = argv[++i];
  }
  return opts;
}

class BadRequest extends Error {}

function columnValues(col) {
  if (!col.json) return col.values;
  return col.values.map((text, i) => {
    let v;
    try { v = JSON.parse(text); } catch (e) {
      throw new BadRequest(`column '${col.name}': row ${i} is not valid JSON: ${e.message}`);
    }
    return typeof v === 'string' ? v : JSON.stringify(v);
  });
}

function readColumns(batch) {
  const cols = new Map((batch.columns || []).map((c) => [c.name, c]));
  for (const name of REQUIRED) {
    if (!cols.has(name)) {
      throw new BadRequest(`missing required column '${name}' (columns present: ${JSON.stringify([...cols.keys()].sort())})`);
    }
  }
  const rows = cols.get('response_text').values.length;
  for (const c of batch.columns) {
    if (c.values.length !== rows) {
      throw new BadRequest(`column '${c.name}' has ${c.values.length} values; column 'response_text' has ${rows} rows`);
    }
  }
  for (const t of batch.tensors || []) {
    if (!t.shape.length || Number(t.shape[0]) !== rows) {
      throw new BadRequest(`tensor '${t.name}' has shape [${t.shape}]; expected ${rows} rows`);
    }
  }
  return Object.fromEntries(REQUIRED.map((name) => [name, columnValues(cols.get(name))]));
}

function containsWholeNumber(response, truth) {
  const t = truth.trim();
  if (!/^-?\d+$/.test(t)) return 0.0; // not a whole number: this rule does not apply
  const want = BigInt(t);
  const tokens = response.match(/(?<![\d.])-?\d+(?![\d.]*\d)/g) || [];
  return tokens.some((tok) => BigInt(tok) === want) ? 1.0 : 0.0;
}

function score(call, callback) {
  let cols;
  try {
    cols = readColumns(call.request.batch || { columns: [], tensors: [] });
  } catch (e) {
    if (e instanceof BadRequest) return callback({ code: grpc.status.INVALID_ARGUMENT, details: e.message });
    return callback({ code: grpc.status.INTERNAL, details: String(e) });
  }
  const scores = cols.response_text.map((r, i) => containsWholeNumber(r, cols.ground_truth[i]));
  callback(null, { scores, failures: [] });
}

function readToken(opts) {
  if (opts.token_file && opts.token_env) throw new Error('set --token-file or --token-env, not both');
  let token = null;
  if (opts.token_file) token = fs.readFileSync(opts.token_file, 'utf8').trim();
  if (opts.token_env) token = (process.env[opts.token_env] || '').trim();
  if ((opts.token_file || opts.token_env) && !token) throw new Error('the token is empty');
  return token;
}

// Server interceptor: `authorization: Bearer <token>` on every call (health optionally open).
function authInterceptor(token, healthOpen) {
  const expected = Buffer.from(`Bearer ${token}`);
  const authorized = (metadata) => {
    const sent = metadata.get('authorization');
    if (sent.length !== 1) return false;
    const got = Buffer.from(String(sent[0]));
    return got.length === expected.length && crypto.timingSafeEqual(got, expected);
  };
  return (methodDescriptor, call) => new grpc.ServerInterceptingCall(call, {
    start: (next) => next({
      onReceiveMetadata: (metadata, mdNext) => {
        if ((healthOpen && methodDescriptor.path.startsWith('/grpc.health.v1.Health/')) || authorized(metadata)) {
          mdNext(metadata);
        } else {
          const missing = metadata.get('authorization').length === 0;
          call.sendStatus({ code: grpc.status.UNAUTHENTICATED,
                            details: missing ? 'missing bearer token' : 'invalid bearer token' });
        }
      },
    }),
  });
}

function credentials(opts) {
  if (!opts.tls_cert) return grpc.ServerCredentials.createInsecure();
  const ca = opts.tls_ca ? fs.readFileSync(opts.tls_ca) : null;
  return grpc.ServerCredentials.createSsl(ca, [{ private_key: fs.readFileSync(opts.tls_key),
                                                 cert_chain: fs.readFileSync(opts.tls_cert) }],
                                          Boolean(opts.require_client_cert));
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const token = readToken(opts);
  const def = protoLoader.loadSync('tandem/v1/reward.proto', { includeDirs: [PROTOS], keepCase: true,
                                                               longs: String, defaults: true });
  const proto = grpc.loadPackageDefinition(def);
  const server = new grpc.Server({ interceptors: token ? [authInterceptor(token, opts.health_without_token)] : [] });
  server.addService(proto.tandem.v1.RewardService.service, { Score: score });
  const health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE]: 'NOT_SERVING' });
  health.addToServer(server);
  server.bindAsync(`${opts.host}:${opts.port}`, credentials(opts), (err, port) => {
    if (err) { console.error(`node reward: cannot bind: ${err.message}`); process.exit(1); }
    health.setStatus('', 'SERVING');
    health.setStatus(SERVICE, 'SERVING');
    if (opts.port_file) { // atomically, once SERVING
      fs.writeFileSync(`${opts.port_file}.tmp`, `${port}\n`);
      fs.renameSync(`${opts.port_file}.tmp`, opts.port_file);
    }
    console.log(`node reward: serving on ${opts.host}:${port} (tls: ${Boolean(opts.tls_cert)}, token: ${Boolean(token)})`);
  });
  const stop = () => {
    health.setStatus('', 'NOT_SERVING');
    health.setStatus(SERVICE, 'NOT_SERVING');
    server.tryShutdown(() => {
      if (opts.port_file && fs.existsSync(opts.port_file)) fs.unlinkSync(opts.port_file);
      process.exit(0);
    });
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
