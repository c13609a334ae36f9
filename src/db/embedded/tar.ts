/**
 * The little of the tar format (POSIX ustar) that the embedded engine's template needs: regular
 * files and directories, written in a fixed order with fixed owners, modes and times, and read
 * back from a stream into a directory. Anything else in an archive (links, devices, paths that
 * leave the directory, a damaged header) is refused.
 */
import { dirname, join } from "node:path";
import { RelayError } from "../../errors.ts";

/** One member of an archive. */
export interface TarEntry {
  /** Relative, `/`-separated, without `.` or `..` segments. */
  path: string;
  type: "file" | "directory";
  /** The contents of a file. */
  data?: Uint8Array;
}

const BLOCK = 512;
const TYPE_FILE = 0x30; // '0'
const TYPE_FILE_OLD = 0x00; // NUL: a regular file in pre-POSIX archives
const TYPE_DIRECTORY = 0x35; // '5'
/** Files and directories are written with these modes whatever the archive says. */
const FILE_MODE = 0o600;
const DIRECTORY_MODE = 0o700;
/** Files up to this size are written while the next ones are read, at most this many at once. */
const SMALL_FILE = 256 * 1024;
const PARALLEL_WRITES = 16;

/** A damaged archive, or one holding what this reader refuses. */
export class TarError extends RelayError {
  constructor(message: string) {
    super("ARCHIVE_INVALID", message);
  }
}

/** The archive of `entries`, in the order given, as one buffer. */
export function tarArchive(entries: readonly TarEntry[]): Uint8Array<ArrayBuffer> {
  const parts: Uint8Array[] = [];
  for (const entry of entries) {
    checkPath(entry.path);
    const data = entry.type === "file" ? entry.data ?? new Uint8Array(0) : new Uint8Array(0);
    parts.push(header(entry, data.length));
    if (data.length > 0) {
      parts.push(data);
      const padding = (BLOCK - data.length % BLOCK) % BLOCK;
      if (padding > 0) parts.push(new Uint8Array(padding));
    }
  }
  parts.push(new Uint8Array(2 * BLOCK)); // the end: two empty blocks
  const archive = new Uint8Array(parts.reduce((sum, part) => sum + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    archive.set(part, offset);
    offset += part.length;
  }
  return archive;
}

/**
 * Writes the members of `archive` under `dir` (which must exist), files with mode 0600 and
 * directories 0700; returns how many members it wrote. Creating a file is mostly waiting for the
 * file system, so small files are written several at a time.
 */
export async function extractTar(
  archive: ReadableStream<Uint8Array>,
  dir: string,
): Promise<number> {
  const input = new ExactReader(archive);
  const made = new Set<string>([dir]);
  const makeDirectory = (path: string) => {
    if (made.has(path)) return;
    Deno.mkdirSync(path, { recursive: true, mode: DIRECTORY_MODE });
    made.add(path);
  };
  const writing = new Set<Promise<void>>();
  let failure: { error: unknown } | null = null;
  const check = () => {
    if (failure) throw failure.error;
  };
  let members = 0;
  try {
    while (true) {
      const block = await input.read(BLOCK);
      if (block === null) throw new TarError("the archive ends without its end marker");
      if (block.every((byte) => byte === 0)) break;
      const member = parseHeader(block);
      const target = join(dir, member.path);
      if (member.type === "directory") {
        makeDirectory(target);
      } else if (member.size <= SMALL_FILE) {
        makeDirectory(dirname(target));
        const data = await input.read(member.size);
        if (data === null) throw new TarError(`the archive ends inside ${target}`);
        await skipPadding(input, target, member.size);
        const write: Promise<void> = Deno.writeFile(target, data, {
          createNew: true,
          mode: FILE_MODE,
        }).catch((error) => void (failure ??= { error }))
          .finally(() => writing.delete(write));
        writing.add(write);
        if (writing.size >= PARALLEL_WRITES) await Promise.race(writing);
        check();
      } else {
        makeDirectory(dirname(target));
        await writeMember(input, target, member.size);
      }
      members++;
    }
    await Promise.all(writing);
    check();
    return members;
  } finally {
    await Promise.all(writing);
    await input.cancel();
  }
}

/** Copies `size` bytes of member data to `path`, then skips the padding to the next block. */
async function writeMember(input: ExactReader, path: string, size: number): Promise<void> {
  const file = Deno.openSync(path, { write: true, createNew: true, mode: FILE_MODE });
  try {
    let left = size;
    while (left > 0) {
      const chunk = await input.readSome(left);
      if (chunk === null) throw new TarError(`the archive ends inside ${path}`);
      let written = 0;
      while (written < chunk.length) written += file.writeSync(chunk.subarray(written));
      left -= chunk.length;
    }
  } finally {
    file.close();
  }
  await skipPadding(input, path, size);
}

/** Skips what pads a member of `size` bytes to the next block. */
async function skipPadding(input: ExactReader, path: string, size: number): Promise<void> {
  const padding = (BLOCK - size % BLOCK) % BLOCK;
  if (padding > 0 && await input.read(padding) === null) {
    throw new TarError(`the archive ends inside ${path}`);
  }
}

interface Member {
  path: string;
  type: "file" | "directory";
  size: number;
}

function parseHeader(block: Uint8Array): Member {
  const stored = readOctal(block, 148, 8);
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : block[i];
  if (stored !== sum) throw new TarError("a header of the archive is damaged (checksum)");
  const name = readString(block, 0, 100);
  const ustar = readString(block, 257, 6) === "ustar";
  const prefix = ustar ? readString(block, 345, 155) : "";
  const path = (prefix === "" ? name : `${prefix}/${name}`).replace(/\/$/, "");
  checkPath(path);
  const flag = block[156];
  if (flag === TYPE_DIRECTORY) return { path, type: "directory", size: 0 };
  if (flag === TYPE_FILE || flag === TYPE_FILE_OLD) {
    return { path, type: "file", size: readOctal(block, 124, 12) };
  }
  throw new TarError(`${path} is neither a file nor a directory (type ${flag})`);
}

/** Refuses an absolute path or one with `.` or `..` segments: it could leave the directory. */
function checkPath(path: string): void {
  const segments = path.split("/");
  if (path === "" || segments.some((s) => s === "" || s === "." || s === "..")) {
    throw new TarError(`refusing the member path ${JSON.stringify(path)}`);
  }
}

function header(entry: TarEntry, size: number): Uint8Array {
  const block = new Uint8Array(BLOCK);
  let name = entry.path + (entry.type === "directory" ? "/" : "");
  let prefix = "";
  if (name.length > 100) {
    // ustar splits a long path at a '/' into a prefix of at most 155 and a name of at most 100.
    const cut = name.lastIndexOf("/", name.length - 2);
    prefix = name.slice(0, cut);
    name = name.slice(cut + 1);
    if (cut <= 0 || prefix.length > 155 || name.length > 100) {
      throw new TarError(`the path ${entry.path} is too long for a tar header`);
    }
  }
  writeString(block, 0, name);
  writeOctal(block, 100, 8, entry.type === "directory" ? DIRECTORY_MODE : FILE_MODE);
  writeOctal(block, 108, 8, 0); // uid
  writeOctal(block, 116, 8, 0); // gid
  writeOctal(block, 124, 12, size);
  writeOctal(block, 136, 12, 0); // mtime: the epoch, so the archive depends on the contents only
  block[156] = entry.type === "directory" ? TYPE_DIRECTORY : TYPE_FILE;
  writeString(block, 257, "ustar");
  writeString(block, 263, "00");
  writeString(block, 345, prefix);
  block.fill(0x20, 148, 156);
  const sum = block.reduce((total, byte) => total + byte, 0);
  writeOctal(block, 148, 7, sum);
  return block;
}

function readString(block: Uint8Array, offset: number, length: number): string {
  const field = block.subarray(offset, offset + length);
  const end = field.indexOf(0);
  return new TextDecoder().decode(end === -1 ? field : field.subarray(0, end));
}

function readOctal(block: Uint8Array, offset: number, length: number): number {
  const text = readString(block, offset, length).trim();
  if (!/^[0-7]+$/.test(text)) throw new TarError("a header of the archive is damaged (number)");
  return parseInt(text, 8);
}

function writeString(block: Uint8Array, offset: number, text: string): void {
  block.set(new TextEncoder().encode(text), offset);
}

/** `value` in octal, zero-padded to `length - 1` digits and a NUL. */
function writeOctal(block: Uint8Array, offset: number, length: number, value: number): void {
  writeString(block, offset, value.toString(8).padStart(length - 1, "0"));
}

/** Reads a byte stream in pieces of the asked length, as views of its chunks where it can. */
class ExactReader {
  #reader: ReadableStreamDefaultReader<Uint8Array>;
  #buffered: Uint8Array[] = [];
  #bufferedBytes = 0;
  #done = false;

  constructor(stream: ReadableStream<Uint8Array>) {
    this.#reader = stream.getReader();
  }

  /** The next `length` bytes, or null if the stream ends before them. */
  async read(length: number): Promise<Uint8Array | null> {
    if (length === 0) return new Uint8Array(0);
    while (this.#bufferedBytes < length && await this.#pull());
    if (this.#bufferedBytes < length) return null;
    if (this.#buffered[0].length >= length) return this.#take(length);
    const out = new Uint8Array(length);
    for (let filled = 0; filled < length;) {
      const part = this.#take(length - filled);
      out.set(part, filled);
      filled += part.length;
    }
    return out;
  }

  /** Between one and `max` of the next bytes, or null at the end of the stream. */
  async readSome(max: number): Promise<Uint8Array | null> {
    while (this.#bufferedBytes === 0 && await this.#pull());
    return this.#bufferedBytes === 0 ? null : this.#take(max);
  }

  async cancel(): Promise<void> {
    await this.#reader.cancel().catch(() => {});
  }

  /** Reads one more chunk from the stream; false at its end. */
  async #pull(): Promise<boolean> {
    if (this.#done) return false;
    const { value, done } = await this.#reader.read();
    if (done) {
      this.#done = true;
      return false;
    }
    if (value.length > 0) {
      this.#buffered.push(value);
      this.#bufferedBytes += value.length;
    }
    return true;
  }

  /** Up to `max` bytes from the first buffered chunk. */
  #take(max: number): Uint8Array {
    const head = this.#buffered[0];
    const take = Math.min(head.length, max);
    if (take === head.length) this.#buffered.shift();
    else this.#buffered[0] = head.subarray(take);
    this.#bufferedBytes -= take;
    return head.subarray(0, take);
  }
}
