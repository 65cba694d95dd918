// Compression interop oracle for tests/test_java_codecs.py: the stream classes Kafka's
// clients and brokers use for record batch v2 payloads, from the jars pyspark ships
// (lz4-java, snappy-java, zstd-jni) and the JDK (gzip, CRC-32C).
//
//   java -cp <jars> KafkaCodecs.java <dir>
//
// For every file <name>.<codec>.plain in <dir> it writes <name>.<codec>.java: the bytes
// compressed as Kafka's producer compresses a batch's records. For every file <name>.batches
// (whole v2 batches, as in a segment file) it writes <name>.records: for each batch, its
// CRC-32C checked with java.util.zip.CRC32C and its records section decompressed as Kafka's
// consumer does, each as a 4-byte big-endian length and the bytes. Any failure is written to
// <name>.error (one line) instead, so the test can say which input failed and why.
import com.github.luben.zstd.ZstdInputStream;
import com.github.luben.zstd.ZstdOutputStream;
import net.jpountz.lz4.LZ4Factory;
import net.jpountz.lz4.LZ4FrameInputStream;
import net.jpountz.lz4.LZ4FrameOutputStream;
import net.jpountz.xxhash.XXHashFactory;
import org.xerial.snappy.SnappyInputStream;
import org.xerial.snappy.SnappyOutputStream;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.zip.CRC32C;
import java.util.zip.GZIPInputStream;
import java.util.zip.GZIPOutputStream;

public class KafkaCodecs {
    static OutputStream compressor(String codec, OutputStream out) throws IOException {
        switch (codec) {
            case "gzip":  // Kafka: GZIPOutputStream with an 8 KiB buffer
                return new GZIPOutputStream(out, 8 * 1024);
            case "snappy":  // Kafka: snappy-java's SnappyOutputStream (xerial framing)
                return new SnappyOutputStream(out);
            case "lz4":  // Kafka's Lz4BlockOutputStream: a frame of independent 64 KiB blocks,
                         // no block or content checksum
                return new LZ4FrameOutputStream(out, LZ4FrameOutputStream.BLOCKSIZE.SIZE_64KB, -1L,
                        LZ4Factory.fastestInstance().fastCompressor(),
                        XXHashFactory.fastestInstance().hash32(),
                        LZ4FrameOutputStream.FLG.Bits.BLOCK_INDEPENDENCE);
            case "zstd":  // Kafka: zstd-jni's stream, level 3
                return new ZstdOutputStream(out, 3);
            default:
                throw new IllegalArgumentException("unknown codec " + codec);
        }
    }

    static InputStream decompressor(int codec, byte[] data, int off, int len) throws IOException {
        InputStream in = new ByteArrayInputStream(data, off, len);
        switch (codec) {
            case 1: return new GZIPInputStream(in, 8 * 1024);
            case 2: return new SnappyInputStream(in);
            case 3: checkKafkaLz4Descriptor(data, off, len); return new LZ4FrameInputStream(in);
            case 4: return new ZstdInputStream(in);
            default: throw new IOException("unknown compression codec " + codec);
        }
    }

    // Kafka's Lz4BlockInputStream refuses descriptors lz4-java's frame reader might accept:
    // FLG must be version 01 with its reserved bit clear, BD's reserved bits clear and its
    // block size one of 64 KiB .. 4 MiB.
    static void checkKafkaLz4Descriptor(byte[] d, int off, int len) throws IOException {
        if (len < 7) throw new IOException("lz4 frame shorter than its header");
        int flg = d[off + 4] & 0xff, bd = d[off + 5] & 0xff;
        if ((flg >> 6) != 1 || (flg & 0x02) != 0) throw new IOException("lz4 FLG " + flg);
        int size = (bd >> 4) & 0x07;
        if ((bd & 0x8f) != 0 || size < 4) throw new IOException("lz4 BD " + bd);
    }

    static byte[] readAll(InputStream in) throws IOException {
        try (in) { return in.readAllBytes(); }
    }

    static byte[] compress(String codec, byte[] plain) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        try (OutputStream out = compressor(codec, buf)) { out.write(plain); }
        return buf.toByteArray();
    }

    static byte[] batchRecords(byte[] log) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        DataOutputStream out = new DataOutputStream(buf);
        ByteBuffer b = ByteBuffer.wrap(log);
        int pos = 0;
        while (pos < log.length) {
            if (log.length - pos < 61) throw new IOException("torn batch header at " + pos);
            int size = 12 + b.getInt(pos + 8);
            if (b.get(pos + 16) != 2) throw new IOException("magic " + b.get(pos + 16) + " at " + pos);
            if (size < 61 || pos + size > log.length) throw new IOException("batch size " + size + " at " + pos);
            CRC32C crc = new CRC32C();
            crc.update(log, pos + 21, size - 21);
            if ((int) crc.getValue() != b.getInt(pos + 17)) throw new IOException("CRC mismatch at " + pos);
            int codec = b.getShort(pos + 21) & 0x07;
            byte[] records = codec == 0
                ? java.util.Arrays.copyOfRange(log, pos + 61, pos + size)
                : readAll(decompressor(codec, log, pos + 61, size - 61));
            out.writeInt(records.length);
            out.write(records);
            pos += size;
        }
        return buf.toByteArray();
    }

    public static void main(String[] args) throws IOException {
        Path dir = Paths.get(args[0]);
        try (DirectoryStream<Path> files = Files.newDirectoryStream(dir)) {
            for (Path f : files) {
                String name = f.getFileName().toString();
                String stem = name.substring(0, name.lastIndexOf('.'));
                try {
                    if (name.endsWith(".plain")) {
                        String codec = stem.substring(stem.lastIndexOf('.') + 1);
                        Files.write(dir.resolve(stem + ".java"), compress(codec, Files.readAllBytes(f)));
                    } else if (name.endsWith(".batches")) {
                        Files.write(dir.resolve(stem + ".records"), batchRecords(Files.readAllBytes(f)));
                    }
                } catch (Exception e) {
                    Files.writeString(dir.resolve(stem + ".error"), e.toString().replace('\n', ' '));
                }
            }
        }
    }
}
