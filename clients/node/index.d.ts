// Types of idem-pg (hand-written; the package has no build step).
import type { Pool, PoolClient, QueryResult, QueryResultRow } from 'pg';

/** What a request is reduced to for the fingerprint. */
export interface CanonicalRequest {
  method: string;
  /** The path with its query string. */
  path: string;
  /** A parsed JSON body, or a string or Buffer (canonicalised if it parses as JSON, else as is), or nothing. */
  body?: unknown;
  /** The key's scope: "<UTF-8 length of tenant>:<tenant>", or "-" (single tenant, anonymous). Default "-". */
  scope?: string;
}

/** An HTTP answer as the library produces and stores it. */
export interface IdemResponse {
  status: number;
  /** Lower-case header names. */
  headers: Record<string, string | string[] | number>;
  body: Buffer | null;
}

export interface LeaseInfo {
  /** The lease's proof of ownership; kept by the middleware, passed to idem_checkpoint / idem_complete. */
  token: string;
  /** 1 for a first run, 2 and more after a takeover of a lease that ran out. */
  attempt: number;
  /** The last recovery point a previous attempt recorded (null on a first run). */
  recoveryPoint: string | null;
  recoveryData: unknown;
  until: string | null;
}

/** The request's idempotency context: req.idem (Express), request.idem (Fastify), idem.current(). */
export interface IdemContext {
  /** The connection holding the claim's transaction: do the business writes on it. */
  client: PoolClient;
  query<R extends QueryResultRow = any>(text: string, values?: unknown[]): Promise<QueryResult<R>>;
  /** The claimed key (tenant-scoped), or null on a route whose key is optional and was not sent. */
  key: string | null;
  /** The Idempotency-Key header as sent. */
  clientKey: string | null;
  bizType: string;
  /** idem_claim's row: claimed, state, result (claimed, a retry of a stored failure under the type's on_failure 'retry': {attempt, previous_error}). */
  claim: { claimed: boolean; state: string; result: any } | null;
  /** 1 for a first run; 2, 3, ... when a stored failure is retried (the business type's on_failure 'retry') or a lease is taken over. */
  attempt: number;
  /** What the previous attempt stored with idem_fail (this library's stored response: {status, headers, body}), when a failure is retried; else null. */
  previousError: unknown;
  /** Lease mode only. */
  lease: LeaseInfo | null;
  /** Lease mode only: record a recovery point (committed at once; renews the lease). */
  checkpoint(point: string, data?: unknown): Promise<void>;
  /** The framework's request object. */
  request: unknown;
  route: RouteOptions;
  finished: boolean;
}

export interface IdemHooks {
  /** After the response is stored, before COMMIT. */
  beforeCommit?(ctx: IdemContext): void | Promise<void>;
  /** After COMMIT, before the response is sent. */
  afterCommit?(ctx: IdemContext): void | Promise<void>;
}

export interface Options {
  /** Header carrying the key (default "Idempotency-Key"). */
  keyHeader?: string;
  /** Shortest accepted key (default 16); shorter keys get 400. */
  minKeyLength?: number;
  /** Longest accepted key (default 255, at most 255). */
  maxKeyLength?: number;
  /** Accept an unquoted key as well as the draft's quoted sf-string (default false). */
  bareKeys?: boolean;
  /** false: a request without the key runs without a claim (still in one transaction). Default true (400). */
  required?: boolean;
  /** true (default): a concurrent duplicate waits for the first and gets its outcome; false: 409 + Retry-After. */
  wait?: boolean;
  /** Bound of that wait in milliseconds (lock_timeout); when it ends: 409 + Retry-After. 0: unbounded. Default 5000. */
  lockTimeout?: number;
  /** Retry-After seconds on 409 and 503 (default 1). */
  retryAfter?: number;
  /** Lease mode: seconds of the lease (the claim commits before the handler runs). Default null. */
  lease?: number | null;
  /** Which statuses are stored and replayed (default: 2xx, 3xx and 4xx except 401, 403, 407, 408, 425, 429); others roll back. */
  store?(status: number): boolean;
  /** Response headers stored with the response (default content-type, location). */
  storeHeaders?: string[];
  /** Bodies larger than this (bytes) are sent but not stored; a replay says Idempotent-Body-Omitted. Default 65536. */
  maxStoredBody?: number;
  /** Body fields ("name" or "dotted.path") left out of the fingerprint. */
  excludeFields?: string[];
  /** Replaces the computed fingerprint (return null for none). */
  fingerprint?(req: any): string | null | Promise<string | null>;
  /** The tenant of the authenticated principal: the claimed key is "<UTF-8 length>:<tenant>:<key>". Null: 500, unless anonymous. */
  tenant?(req: any): string | null | undefined | Promise<string | null | undefined>;
  /** No tenant hook: every caller shares one key space. A route needs tenant or singleTenant. */
  singleTenant?: boolean;
  /** With a tenant hook: a request without a tenant is claimed in the shared scope "-" instead of refused. */
  anonymous?: boolean;
  /** Base URI of the problem types in error bodies: type = problemBase + slug. */
  problemBase?: string;
  /** The claim as a named prepared statement after its own BEGIN, one round trip more than the default (default false; not behind PgBouncer in transaction mode before 1.21). */
  prepare?: boolean;
  /** Where the refusal of a request without a tenant is logged (default console). */
  logger?: { error(message: string): void };
  hooks?: IdemHooks;
}

export interface RouteOptions extends Options {
  /** The operation: idem's biz_type (^[A-Za-z0-9_.:-]{1,64}$). */
  bizType: string;
}

export interface CreateOptions extends Options {
  pool: Pool;
  /** Schema of the extension's functions when it is not on the search_path. */
  schema?: string;
}

export type ExpressMiddleware = (req: any, res: any, next: (err?: unknown) => void) => void;
export type ExpressErrorHandler = (err: unknown, req: any, res: any, next: (err?: unknown) => void) => void;
export type FastifyPlugin = (fastify: any, opts: Record<string, unknown>, done: (err?: Error) => void) => void;

export declare class Idem {
  constructor(options: CreateOptions);
  readonly pool: Pool;
  readonly defaults: Options;
  /** The context of the request being handled (AsyncLocalStorage). */
  current(): IdemContext | undefined;
  route(options: RouteOptions): RouteOptions;
  begin(req: { method: string; path: string; headers: Record<string, any>; body?: unknown }, route: RouteOptions, raw: unknown):
    Promise<{ response: IdemResponse; ctx?: undefined } | { ctx: IdemContext; response?: undefined }>;
  finish(ctx: IdemContext, response: { status: number; headers: Record<string, any>; body: Buffer | null; streamed?: boolean }):
    Promise<{ response?: IdemResponse }>;
  responseForError(route: RouteOptions, err: unknown): IdemResponse | null;
  /** Express per-route middleware. */
  express(options: RouteOptions): ExpressMiddleware;
  /** Express error handler: transient database errors become 503 + Retry-After. */
  expressErrorHandler(): ExpressErrorHandler;
  /** The verify option of Express's body parsers: keeps the body's bytes (req.rawBody), which the fingerprint counts. */
  rawBody(req: any, res: any, buf: Buffer): void;
  /** Fastify plugin; routes opt in with config: { idem: RouteOptions }. */
  readonly fastify: FastifyPlugin;
}

export declare function createIdem(options: CreateOptions): Idem;
export declare function expressMiddleware(idem: Idem, options: RouteOptions): ExpressMiddleware;
export declare function expressErrorHandler(idem: Idem): ExpressErrorHandler;
export declare function keepRawBody(req: any, res: any, buf: Buffer): void;
export declare const idemFastify: FastifyPlugin;
export declare function canonicalJson(value: unknown): string;
export declare function canonicalRequest(req: CanonicalRequest, excludeFields?: string[]): Buffer;
export declare function canonicalBody(body: unknown, excludeFields?: string[]): Buffer;
/** The request target as the fingerprint counts it: path percent-decoded then encoded (unreserved and "/" kept), query escapes normalised. */
export declare function canonicalTarget(target: string): string;
/** Parses an Idempotency-Key field value: the key, or null and why not. */
export declare function parseKeyField(raw: string, options?: { minKeyLength?: number; maxKeyLength?: number; bareKeys?: boolean }):
  { key: string; why: '' } | { key: null; why: string };
/** The problem types: slug -> [status, title]. */
export declare const PROBLEMS: Readonly<Record<string, readonly [number, string]>>;
export declare const DEFAULT_PROBLEM_BASE: string;
/** Statuses never stored: 401, 403, 407, 408, 425, 429. */
export declare const TRANSIENT_REFUSALS: ReadonlySet<number>;
export declare function defaultStore(status: number): boolean;
/** 32 hex digits of SHA-256 over canonicalRequest. */
export declare function fingerprint(req: CanonicalRequest, excludeFields?: string[]): string;
export declare function isTransient(err: unknown): boolean;
export declare function isConnectionError(err: unknown): boolean;
export declare const TRANSIENT_SQLSTATES: ReadonlySet<string>;
/** The answer to a duplicate of a completed or failed claim: its stored response; without one, 204 (completed) or the 422 response-not-replayable problem (failed). `expires` (an HTTP-date, the claim's expiry) is sent as Idempotent-Expires. */
export declare function replay(result: unknown, state?: 'completed' | 'failed', options?: { problemBase: string }, expires?: string | null): IdemResponse;
