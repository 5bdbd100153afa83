// Preloaded into the conformance suite's Node (node --import): every request it sends to the gateway
// under test carries the bearer token from CONFORMANCE_BEARER_TOKEN, as a configured MCP client's would.
// The suite has no option for a header; its requests (the SDK's client, fetch and undici's request) all
// go through undici's global dispatcher, which this replaces with one that adds the header to requests
// for CONFORMANCE_BEARER_ORIGIN only. Certificates: NODE_EXTRA_CA_CERTS.
import { Agent, setGlobalDispatcher } from 'undici';

const token = process.env.CONFORMANCE_BEARER_TOKEN;
const origin = process.env.CONFORMANCE_BEARER_ORIGIN;
if (!token || !origin) {
  throw new Error('bearer.mjs needs CONFORMANCE_BEARER_TOKEN and CONFORMANCE_BEARER_ORIGIN');
}
const authorization = `Bearer ${token}`;

function withAuthorization(headers) {
  if (headers == null) return { authorization };
  if (Array.isArray(headers)) {
    const flat = headers.length > 0 && Array.isArray(headers[0]) ? headers.flat() : [...headers];
    for (let i = 0; i < flat.length; i += 2) {
      if (String(flat[i]).toLowerCase() === 'authorization') return headers;
    }
    return [...flat, 'authorization', authorization];
  }
  if (typeof headers[Symbol.iterator] === 'function') {
    return withAuthorization([...headers]);
  }
  if (Object.keys(headers).some((name) => name.toLowerCase() === 'authorization')) return headers;
  return { ...headers, authorization };
}

setGlobalDispatcher(
  new Agent().compose((dispatch) => (options, handler) => {
    const target = new URL(String(options.origin)).origin;
    return dispatch(target === origin ? { ...options, headers: withAuthorization(options.headers) } : options,
      handler);
  })
);
